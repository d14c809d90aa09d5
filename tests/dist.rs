//! The data-parallel process group's setup, without GPUs: the launch environment, the rendezvous over
//! loopback (a whole world, mismatched world sizes, a rank that never arrives, a rank 0 that is gone —
//! each an error on every rank within the timeout, never a hang) and `kiln-run` (torchrun's environment,
//! output prefixed by rank, the first failure stopping the world).

use kiln::dist::rendezvous::rendezvous;
use kiln::dist::DistEnv;
use kiln::Error;
use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port()
}

fn env(rank: usize, world: usize, port: u16, timeout_ms: u64) -> DistEnv {
    DistEnv {
        rank,
        world,
        local_rank: rank,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        timeout: Duration::from_millis(timeout_ms),
    }
}

/// Runs one rendezvous per env on its own thread; rank 0's payload is `b"id-of-the-world"`.
fn meet(envs: Vec<DistEnv>) -> Vec<Result<Vec<u8>, String>> {
    let threads: Vec<_> = envs
        .into_iter()
        .map(|e| {
            std::thread::spawn(move || rendezvous(&e, || Ok(b"id-of-the-world".to_vec())).map_err(|e| e.to_string()))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn a_whole_world_shares_rank_zeros_payload() {
    let port = free_port();
    let got = meet((0..4).rev().map(|r| env(r, 4, port, 20_000)).collect());
    assert!(got.iter().all(|g| g.as_deref() == Ok(&b"id-of-the-world"[..])), "{got:?}");
}

#[test]
fn a_mismatched_world_size_fails_every_rank() {
    let port = free_port();
    let start = Instant::now();
    let got = meet(vec![env(0, 3, port, 5_000), env(1, 2, port, 5_000), env(2, 3, port, 5_000)]);
    assert!(got.iter().all(|g| g.as_ref().is_err_and(|e| e.contains("WORLD_SIZE=2"))), "{got:?}");
    assert!(start.elapsed() < Duration::from_secs(4), "told, not timed out: {:?}", start.elapsed());
}

#[test]
fn a_rank_that_never_arrives_fails_the_others_within_the_timeout() {
    let port = free_port();
    let start = Instant::now();
    let got = meet(vec![env(0, 3, port, 1_500), env(1, 3, port, 1_500)]);
    for g in &got {
        assert!(g.as_ref().is_err_and(|e| e.contains("rank(s) [2] did not arrive")), "{got:?}");
    }
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
}

#[test]
fn without_rank_zero_a_rank_fails_within_the_timeout() {
    let start = Instant::now();
    let got = meet(vec![env(1, 2, free_port(), 1_000)]);
    assert!(got[0].as_ref().is_err_and(|e| e.contains("could not reach rank 0")), "{got:?}");
    assert!(start.elapsed() < Duration::from_secs(4), "{:?}", start.elapsed());
}

#[test]
fn two_processes_claiming_one_rank_fail() {
    let port = free_port();
    let got = meet(vec![env(0, 3, port, 5_000), env(1, 3, port, 5_000), env(1, 3, port, 5_000)]);
    assert!(got.iter().all(|g| g.as_ref().is_err_and(|e| e.contains("two processes claim rank 1"))), "{got:?}");
}

#[test]
fn rank_zeros_own_failure_reaches_every_rank() {
    let port = free_port();
    let e0 = env(0, 2, port, 5_000);
    let zero = std::thread::spawn(move || {
        rendezvous(&e0, || Err(Error::Distributed { rank: Some(0), msg: "NCCL not found".into() }))
    });
    let one = rendezvous(&env(1, 2, port, 5_000), || unreachable!()).unwrap_err().to_string();
    assert!(zero.join().unwrap().is_err());
    assert!(one.contains("NCCL not found"), "{one}");
}

#[test]
fn the_environment_is_read_as_torchrun_writes_it() {
    let vars = |pairs: &[(&str, &str)]| {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        DistEnv::from_vars(move |k| m.get(k).cloned())
    };
    assert_eq!(vars(&[]).unwrap(), None, "not launched as a world");
    let e = vars(&[("WORLD_SIZE", "2"), ("RANK", "1"), ("LOCAL_RANK", "1"), ("MASTER_PORT", "2950")]).unwrap().unwrap();
    assert_eq!((e.rank, e.world, e.local_rank, e.master_addr.as_str(), e.master_port), (1, 2, 1, "127.0.0.1", 2950));
    for (pairs, says) in [
        (&[("WORLD_SIZE", "2")][..], "RANK is not set"),
        (&[("WORLD_SIZE", "2"), ("RANK", "2")][..], "RANK=2 is not below WORLD_SIZE=2"),
        (&[("WORLD_SIZE", "two"), ("RANK", "0")][..], "WORLD_SIZE=\"two\""),
        (&[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", "70000")][..], "MASTER_PORT=70000"),
    ] {
        let e = vars(pairs).unwrap_err().to_string();
        assert!(e.contains(says), "{pairs:?}: {e}");
    }
}

/// Run as a child of `kiln-run` (this test binary started again): meet the world, print the payload.
#[test]
fn kiln_run_starts_a_world_that_meets() {
    if let Some(world) = kiln::dist::DistEnv::from_env().unwrap() {
        let got = rendezvous(&world, || Ok(format!("id from rank 0 of {}", world.world).into_bytes())).unwrap();
        println!("rank {} of {} got {:?}", world.rank, world.world, String::from_utf8(got).unwrap());
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kiln-run"))
        .args(["--gpus", "3", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "kiln_run_starts_a_world_that_meets", "--nocapture", "--test-threads", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for r in 0..3 {
        let said = stdout.lines().any(|l| {
            l.starts_with(&format!("[rank {r}] ")) && l.contains(&format!("rank {r} of 3 got \"id from rank 0 of 3\""))
        });
        assert!(said, "rank {r}: {stdout}");
    }
}

#[test]
fn kiln_run_stops_the_world_when_a_rank_fails() {
    let start = Instant::now();
    let script = "echo \"up $RANK/$WORLD_SIZE local $LOCAL_RANK port $MASTER_PORT\"; [ \"$RANK\" = 1 ] && sleep 1 && exit 3; sleep 60";
    let out =
        Command::new(env!("CARGO_BIN_EXE_kiln-run")).args(["--gpus", "3", "--", "sh", "-c", script]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(start.elapsed() < Duration::from_secs(30), "the others were stopped: {:?}", start.elapsed());
    assert!(stderr.contains("rank 1 exited with status 3: stopping the other 2 rank(s)"), "{stderr}");
    for r in 0..3 {
        assert!(stdout.contains(&format!("[rank {r}] up {r}/3 local {r} port ")), "{stdout}");
    }
}
