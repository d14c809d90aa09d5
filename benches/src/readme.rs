//! The README's numbers, rendered from a committed report: the table and the one-line summary between
//! `<!-- bench:begin PATH -->` and `<!-- bench:end -->` are this module's output for the JSON at PATH,
//! and a test fails when they differ, so the README can only say what a run measured.

use crate::report::{spread, Report, ResultRow};
use crate::trials::{best_rows, call_verdict, verdict};
use std::path::Path;

const BEGIN: &str = "<!-- bench:begin ";
const END: &str = "<!-- bench:end -->";

/// Workloads (by id) whose rows a report may lack, what they are, and what they wait for; said only when
/// the report has no row of that id.
const WAITING: [(&str, &str, &str); 3] = [
    (
        "W5-train-bf16",
        "W5 training step in bf16",
        "kiln's row exists (`--workload W5-train-bf16`: parameters and moments bf16, the update in f32, every output checked; `scripts/gpu.sh parts Tb`) and torch's (the peer's W5-train-bf16, fused AdamW on bf16 parameters); this run did not measure them",
    ),
    (
        "W5-train",
        "W5 training step (forward + backward + AdamW)",
        "kiln's row exists (`--workload W5-train`: forward, mean-square loss, backward, AdamW, every output checked) and torch's (the peer's W5-train); this run did not measure them",
    ),
    (
        "W6",
        "W6 densenet121 inference",
        "kiln's row exists (`--workload W6`: DenseNet-121's layers, convolutions as im2col + matmul, checked) and torch's (the peer's W6, checked against kiln's reference); this run did not measure them",
    ),
];

/// The numbers section for `report`, which was read from `path` (as the README names it).
pub fn render(report: &Report, path: &Path) -> String {
    let path = path.display().to_string();
    let mut s = format!("{BEGIN}{path} -->\n");
    let device = report.devices.iter().find(|d| d.starts_with("cuda")).or(report.devices.first());
    let trials = |backend: &str| report.results.iter().filter(|r| r.backend == backend).map(|r| r.trials).max();
    s.push_str(&format!(
        "Measured on {} — kiln in {} fresh processes, torch.compile in {}; report [`{path}`]({path}).\n\n",
        device.map_or("an unnamed device", |d| d.as_str()),
        trials("cuda").or(trials("wgpu")).unwrap_or(0),
        trials("torch-cuda").unwrap_or(0),
    ));
    s.push_str("| id | kiln device ms | torch best device ms | ratio | verdict | kiln call + sync ms | torch best call + sync ms | verdict | peak MiB kiln / torch (compiled / default) | compile s kiln / torch, cold (warm) | outputs |\n");
    s.push_str("|---|---:|---:|---:|---|---:|---:|---|---:|---:|---|\n");
    let backend = if report.results.iter().any(|r| r.backend == "cuda") { "cuda" } else { "wgpu" };
    let kiln = best_rows(report, &|r| r.backend == backend, &|r| Some(r.median_ms));
    let torch = best_rows(report, &|r| r.backend.starts_with("torch"), &|r| Some(r.median_ms));
    let kiln_call = best_rows(report, &|r| r.backend == backend, &|r| r.call_ms);
    let torch_call = best_rows(report, &|r| r.backend.starts_with("torch"), &|r| r.call_ms);
    let find =
        |b: &str, w: &str, m: &str| report.results.iter().find(|r| r.backend == b && r.workload == w && r.mode == m);
    let (mut wins, mut ties, mut losses) = (Vec::new(), Vec::new(), Vec::new());
    for (id, k) in &kiln {
        let t = torch.get(id);
        let ratio = t.map(|t| k.median_ms / t.median_ms);
        let v = t.map(|t| verdict(k, t));
        match v {
            Some("win") => wins.push(id.clone()),
            Some("loss") => losses.push(format!("{id} ({:.2}x)", ratio.unwrap_or(f64::NAN))),
            Some(_) => ties.push(id.clone()),
            None => {}
        }
        let (kc, tc) = (kiln_call.get(id), torch_call.get(id));
        // Compile: kiln's compiled mode against torch's default mode, cold (warm).
        let compile = |r: Option<&ResultRow>| {
            r.map_or("—".into(), |r| {
                format!(
                    "{}{}",
                    r.cold_compile_ms.map_or("—".into(), |c| format!("{:.2}", c / 1e3)),
                    r.warm_compile_ms.map_or(String::new(), |w| format!(" ({:.2})", w / 1e3))
                )
            })
        };
        let mib = |r: Option<&ResultRow>| {
            r.and_then(|r| r.peak_bytes).map_or("—".into(), |b| format!("{:.0}", b as f64 / (1u64 << 20) as f64))
        };
        let ok = |r: Option<&ResultRow>| match r.and_then(|r| r.correct) {
            Some(true) => "✓",
            Some(false) => "✗",
            None => "—",
        };
        s.push_str(&format!(
            "| {id} | {} ({}) | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | kiln {} torch {} |\n",
            spread(k.median_ms, k.min_ms, k.max_ms),
            k.mode,
            t.map_or("—".into(), |t| format!(
                "{} ({} {})",
                spread(t.median_ms, t.min_ms, t.max_ms),
                t.workload,
                t.mode
            )),
            ratio.map_or("—".into(), |r| format!("{r:.2}x")),
            v.unwrap_or("—"),
            kc.map_or("—".into(), |c| format!(
                "{} ({})",
                spread(c.call_ms.unwrap_or(f64::NAN), c.call_min_ms, c.call_max_ms),
                c.mode
            )),
            tc.map_or("—".into(), |c| format!(
                "{} ({})",
                spread(c.call_ms.unwrap_or(f64::NAN), c.call_min_ms, c.call_max_ms),
                c.mode
            )),
            match (kc, tc) {
                (Some(a), Some(b)) => call_verdict(a, b),
                _ => "—",
            },
            // Peak memory of the same kind of run on both sides: kiln's compiled mode and torch's default
            // mode (neither holds a CUDA graph's pool), as the compile column compares them.
            mib(find(backend, &k.workload, "compiled")),
            mib(t.and_then(|t| find(&t.backend, &t.workload, "default"))),
            compile(find(backend, &k.workload, "compiled")),
            compile(find("torch-cuda", id, "default")),
            ok(find(backend, &k.workload, "compiled")),
            ok(t),
        ));
    }
    let dynamic = |b: &str| report.results.iter().find(|r| r.backend == b && r.workload == "W3-dynamic");
    if let Some(k) = dynamic(backend) {
        let say = |r: &ResultRow| {
            format!(
                "{} graphs compiled, {:.2} s compiling, {} ms per call",
                r.compiles.map_or("?".into(), |c| c.to_string()),
                r.cold_compile_ms.or(r.warm_compile_ms).unwrap_or(f64::NAN) / 1e3,
                spread(r.median_ms, r.min_ms, r.max_ms)
            )
        };
        s.push_str(&format!(
            "\nDynamic shapes, W3 over 20 row counts: kiln ({}) {}; torch ({}) {}.\n",
            k.mode,
            say(k),
            dynamic("torch-cuda").map_or("not run".into(), |t| t.mode.clone()),
            dynamic("torch-cuda").map_or("—".into(), say)
        ));
    }
    for (id, what, why) in WAITING {
        if !report.results.iter().any(|r| r.workload == id) {
            s.push_str(&format!("\n{what}: {why}."));
        }
    }
    s.push_str(&format!(
        "\n\n**Summary** (device time against torch's best mode, win/loss only where the trial ranges do not overlap): wins on {}; ties on {}; losses on {}.\n",
        list(&wins),
        list(&ties),
        list(&losses)
    ));
    s.push_str(END);
    s
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// Every numbers section of `text` (one per committed run: the H200's, the H100's), in order: the report
/// path each names and the section itself (markers included).
pub fn sections(text: &str) -> Vec<(String, &str)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(rel) = text[from..].find(BEGIN) {
        let start = from + rel;
        let (Some(p), Some(e)) = (text[start..].find(" -->"), text[start..].find(END)) else { break };
        let end = start + e + END.len();
        out.push((text[start + BEGIN.len()..start + p].to_string(), &text[start..end]));
        from = end;
    }
    out
}

/// Replaces the numbers section of `readme` that names `json` with the one `report` renders.
pub fn write(report: &Report, json: &Path, readme: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(readme).map_err(|e| format!("{}: {e}", readme.display()))?;
    let name = json.display().to_string();
    let (_, old) = sections(&text).into_iter().find(|(p, _)| *p == name).ok_or_else(|| {
        format!("{} has no `{BEGIN}{name} -->` … `{END}` section (add the two markers where it goes)", readme.display())
    })?;
    let new = text.replacen(old, &render(report, json), 1);
    std::fs::write(readme, new).map_err(|e| format!("{}: {e}", readme.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's numbers are what its committed reports render, to the character, section by section.
    #[test]
    fn the_readmes_numbers_are_rendered_from_the_committed_reports() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let text = std::fs::read_to_string(root.join("README.md")).expect("README.md");
        let all = sections(&text);
        assert!(!all.is_empty(), "README.md has a bench:begin … bench:end section");
        for (path, section) in all {
            let report = Report::load(&root.join(&path)).expect("the report the README names");
            assert_eq!(
                section,
                render(&report, Path::new(&path)),
                "README.md's numbers differ from what {path} renders: run `cargo run -p kiln-bench -- --readme {path} --write-readme README.md`"
            );
        }
    }

    #[test]
    fn rendering_says_wins_ties_and_losses_from_the_ranges() {
        let mut r = Report::new(false);
        let row = |w: &str, b: &str, m: &str, ms: f64, lo: f64, hi: f64| {
            let mut x = ResultRow::timed(w, b, m, ms, "CUDA events");
            x.min_ms = Some(lo);
            x.max_ms = Some(hi);
            x.trials = 5;
            x.call_ms = Some(ms * 1.1);
            x.correct = Some(true);
            x
        };
        r.results = vec![
            row("W1", "cuda", "compiled", 1.0, 0.9, 1.1),
            row("W1", "torch-cuda", "default", 2.0, 1.9, 2.1),
            row("W2", "cuda", "compiled", 1.0, 0.9, 1.1),
            row("W2", "torch-cuda", "max-autotune-no-cudagraphs", 1.05, 1.0, 1.2),
            row("W5", "cuda", "compiled", 3.0, 2.9, 3.1),
            row("W5-sdpa", "torch-cuda", "reduce-overhead", 1.5, 1.4, 1.6),
            row("W5", "torch-cuda", "eager", 1.0, 1.0, 1.0),
        ];
        let s = render(&r, Path::new("x.json"));
        assert!(s.contains("wins on W1; ties on W2; losses on W5 (2.00x)"), "{s}");
        assert!(
            s.contains("1.5000 (1.4000–1.6000) (W5-sdpa reduce-overhead)"),
            "eager never counts as torch's best: {s}"
        );
        let text = format!("intro\n{s}\nmore");
        let (path, sec) = sections(&text).into_iter().next().expect("section");
        assert_eq!((path.as_str(), sec), ("x.json", s.as_str()));
        let two = format!("{s}\nbetween\n{}", render(&r, Path::new("y.json")));
        let found: Vec<String> = sections(&two).into_iter().map(|(p, _)| p).collect();
        assert_eq!(found, ["x.json", "y.json"]);
    }
}
