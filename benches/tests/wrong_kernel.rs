//! The bench's output checks catch a wrong kernel in every mode: with `KILN_TEST_WRONG_KERNEL` set
//! (every kernel writing a graph output stores its last element one too large), each kiln row of the
//! bench is marked wrong and the bench exits with status 1. Runs the bench binary as a user does, on the
//! wgpu adapter (lavapipe in CI); with none it fails saying what to install, unless
//! `KILN_WGPU_TESTS=skip`.

use std::process::Command;

/// The bench at quick sizes on the wgpu adapter, timing little: `workloads`, then `extra` arguments.
fn bench(workloads: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln-bench"));
    cmd.args(["--quick", "--backend", "wgpu", "--repeat", "2", "--batch", "2", "--workload", workloads]).args(extra);
    cmd
}

/// True (and says so) where the caller opted out of GPU-API tests.
fn skipped() -> bool {
    let skip = std::env::var("KILN_WGPU_TESTS").as_deref() == Ok("skip");
    if skip {
        eprintln!("KILN_WGPU_TESTS=skip: not run");
    }
    skip
}

fn run(wrong: bool, json: &std::path::Path) -> std::process::Output {
    let cache = std::env::temp_dir().join(format!("kiln-wrong-kernel-cache-{}-{wrong}", std::process::id()));
    let mut cmd = bench("W1,W2,W3-dynamic", &["--json"]);
    cmd.arg(json)
        // A cache of its own: a wrong kernel must never be served to another run (the knob is in the key).
        .env("KILN_BENCH_CACHE", &cache);
    if wrong {
        cmd.env("KILN_TEST_WRONG_KERNEL", "1");
    } else {
        cmd.env_remove("KILN_TEST_WRONG_KERNEL");
    }
    let out = cmd.output().expect("the bench runs");
    let _ = std::fs::remove_dir_all(&cache);
    out
}

#[test]
fn every_mode_catches_a_wrong_kernel_and_passes_a_right_one() {
    if skipped() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kiln-wrong-kernel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for wrong in [true, false] {
        let json = dir.join(format!("{wrong}.json"));
        let out = run(wrong, &json);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("no wgpu adapter") && !stderr.contains("unavailable"),
            "no wgpu adapter: install Mesa's Vulkan drivers (apt-get install mesa-vulkan-drivers libvulkan1), or set KILN_WGPU_TESTS=skip\n{stderr}"
        );
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_else(|e| panic!("{e}\n{stderr}")))
                .expect("JSON report");
        let rows: Vec<(String, Option<bool>)> = report["results"]
            .as_array()
            .expect("results")
            .iter()
            .filter(|r| r["backend"] == "wgpu")
            .map(|r| (format!("{} {}", r["workload"], r["mode"]), r["correct"].as_bool()))
            .collect();
        let modes: std::collections::BTreeSet<&str> =
            rows.iter().map(|(k, _)| k.split(' ').nth(1).unwrap_or_default()).collect();
        assert!(rows.len() >= 5 && modes.len() >= 3, "compiled, eager and the dynamic row ran: {rows:?}");
        for (row, correct) in &rows {
            assert_eq!(*correct, Some(!wrong), "{row} (wrong kernel: {wrong})");
        }
        assert_eq!(out.status.code(), Some(if wrong { 1 } else { 0 }), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn modes_choose_the_rows_and_reject_unknown_ones() {
    if skipped() {
        return;
    }
    let json = std::env::temp_dir().join(format!("kiln-modes-{}.json", std::process::id()));
    let bench = |modes: &str| bench("W1", &["--modes", modes, "--json"]).arg(&json).output().expect("the bench runs");
    let out = bench("compiled");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("a report")).expect("JSON report");
    let modes: Vec<&str> =
        report["results"].as_array().expect("results").iter().filter_map(|r| r["mode"].as_str()).collect();
    assert_eq!(modes, vec!["compiled"], "{stderr}");
    let out = bench("compiled,fast");
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`fast` is not one of"), "{out:?}");
    let _ = std::fs::remove_file(&json);
}
