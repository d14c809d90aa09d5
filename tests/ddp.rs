//! Data-parallel training over NCCL as a user runs it. Without GPUs: asking for it where it cannot run
//! (no launched world, a backend without NCCL) is an error that says what to do. On a machine of two
//! GPUs (`scripts/gpu.sh nccl2`): `fit` as two ranks of `kiln-run --gpus 2` follows the one-GPU run with
//! the same global batch (losses, validation, final parameters); and a rank that dies mid-training makes
//! the other fail with a distributed error within the world's timeout instead of hanging in NCCL.

mod common;

use common::classifier::{blobs, Mlp};
use kiln::data::Loader;
use kiln::dist::{DistEnv, ProcessGroup};
use kiln::fit::{fit, FitConfig, Fitted, Strategy};
use kiln::optim::AdamW;
use kiln::train::Trainer;
use kiln::{Backend, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Samples per rank in a batch (the one-GPU run takes twice as many).
const PER_RANK: usize = 12;

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port()
}

/// `kiln-run`: the one staged beside the tests on a GPU machine (`KILN_RUN`), else this build's.
fn kiln_run() -> PathBuf {
    std::env::var_os("KILN_RUN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kiln-run")), PathBuf::from)
}

fn fit_blobs(batch: usize, strategy: Strategy, out: &Path) -> Fitted<Mlp> {
    // 96 samples: four batches of 24 on one GPU, four of 12 on each of two ranks (the same samples per step).
    let train = Loader::new(blobs(96, 1), batch).shuffle(Some(11));
    let val = Loader::new(blobs(30, 2), 16).shuffle(None);
    let opt = AdamW { lr: 3e-2, ..AdamW::default() };
    let cfg = FitConfig { max_epochs: 3, seed: 7, out: Some(out.to_path_buf()), strategy, ..FitConfig::default() };
    let loss = |m: &Mlp, b: &[Tensor]| m.loss(b);
    fit(Mlp::new(4, 16, 3, 5), opt, loss, loss, &train, Some(&val), Backend::Cuda, &cfg).unwrap()
}

#[test]
fn data_parallel_needs_a_launched_world_and_cuda() {
    let env = DistEnv {
        rank: 0,
        world: 1,
        local_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: free_port(),
        timeout: Duration::from_secs(5),
    };
    let e = ProcessGroup::init(&env, Backend::Kernels).unwrap_err().to_string();
    assert!(e.contains("needs the CUDA backend") && e.contains("kernels"), "{e}");
    // Not started by a launcher (this test binary never is, except as the children below).
    if std::env::var_os("WORLD_SIZE").is_none() {
        let train = Loader::new(blobs(10, 1), 4);
        let cfg = FitConfig { strategy: Strategy::Ddp, ..FitConfig::default() };
        let loss = |m: &Mlp, b: &[Tensor]| m.loss(b);
        let e = fit(Mlp::new(4, 8, 3, 5), AdamW::default(), loss, loss, &train, None, Backend::Kernels, &cfg)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("kiln-run --gpus N"), "{e}");
    }
}

#[test]
#[ignore = "needs two NVIDIA GPUs and NCCL: run with --include-ignored on such a machine (scripts/gpu.sh nccl2)"]
fn two_gpus_ddp_follows_one_gpu_with_the_global_batch() {
    if let Some(dir) = std::env::var_os("KILN_DDP_CHILD_OUT") {
        // A rank of the world `kiln-run` started (this test binary again).
        let dir = PathBuf::from(dir);
        let f = fit_blobs(PER_RANK, Strategy::Ddp, &dir.join("run"));
        let rank = std::env::var("RANK").unwrap();
        let losses: Vec<f64> = f.history.steps.iter().map(|s| s.loss).collect();
        let vals: Vec<Option<f64>> = f.history.epochs.iter().map(|e| e.val_loss).collect();
        let stats = (f.train_stats.traces, f.train_stats.calls);
        std::fs::write(dir.join(format!("rank{rank}.json")), serde_json::json!([losses, vals, stats]).to_string())
            .unwrap();
        return;
    }
    let dir = std::env::temp_dir().join(format!("kiln-ddp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let started = Instant::now();
    let out = Command::new(kiln_run())
        .args(["--gpus", "2", "--master-port", &free_port().to_string(), "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "two_gpus_ddp_follows_one_gpu_with_the_global_batch", "--include-ignored", "--nocapture"])
        .env("KILN_DDP_CHILD_OUT", &dir)
        .output()
        .unwrap();
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    eprintln!("two ranks trained in {:?}", started.elapsed());
    let read = |r: usize| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("rank{r}.json"))).unwrap()).unwrap()
    };
    let (r0, r1) = (read(0), read(1));
    assert_eq!(r0, r1, "both ranks record the same (averaged) history");
    assert_eq!(r0[2], serde_json::json!([1, 12]), "the step (its all-reduces inside) traced once for 12 steps: {r0}");

    let one = fit_blobs(2 * PER_RANK, Strategy::Single, &dir.join("one"));
    let floats =
        |v: &serde_json::Value| -> Vec<f64> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect() };
    let ddp_losses = floats(&r0[0]);
    let one_losses: Vec<f64> = one.history.steps.iter().map(|s| s.loss).collect();
    assert_eq!(ddp_losses.len(), one_losses.len());
    for (i, (a, b)) in ddp_losses.iter().zip(&one_losses).enumerate() {
        assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "step {}: 2 GPUs {a} vs 1 GPU {b}", i + 1);
    }
    let one_vals: Vec<f64> = one.history.epochs.iter().map(|e| e.val_loss.unwrap()).collect();
    for (a, b) in floats(&r0[1]).iter().zip(&one_vals) {
        assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "validation: 2 GPUs {a} vs 1 GPU {b}");
    }
    eprintln!("losses, 2 GPUs: {ddp_losses:?}\nlosses, 1 GPU:  {one_losses:?}");
    // Rank 0's last checkpoint holds the parameters both ranks trained to.
    let saved = kiln::fit::state::load(&dir.join("run/checkpoints/last"), &Mlp::new(4, 16, 3, 5), false).unwrap();
    use kiln::nn::Module;
    for (a, b) in saved.model.tensors().iter().zip(one.model.tensors()) {
        let (a, b): (Vec<f32>, Vec<f32>) = (a.to_vec().unwrap(), b.to_vec().unwrap());
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "parameters: {x} vs {y}");
        }
    }
    assert!(dir.join("run/metrics.json").exists(), "rank 0 wrote the run's metrics");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A compiled function's all-reduce where no world was joined (one process, one GPU) is the value
/// itself, and so is its gradient: the bucket runs as a device copy, no NCCL.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on such a machine"]
fn a_compiled_all_reduce_in_a_world_of_one_is_the_value_and_so_is_its_gradient() {
    use kiln::graph::ir::CollectiveOp;
    let rt = Backend::Cuda.runtime().unwrap().expect("a device");
    let values = [1.0f32, -2.0, 3.5, 0.25, 8.0];
    let x = Tensor::from_data(kiln::TensorData::new(&values, &[5]).unwrap()).to(rt).unwrap();
    let f = |t: Vec<Tensor>| {
        let f = |a: &[Tensor]| a[0].all_reduce(CollectiveOp::Mean)?.mul(&a[0])?.sum(&[0], false);
        let (value, grads) = kiln::value_and_grad(f, &t, &[0])?;
        Ok(vec![value, grads[0].all_reduce(CollectiveOp::Sum)?])
    };
    // Launched, then recorded as a CUDA graph and replayed (reduce-overhead).
    for mode in [kiln::Mode::Default, kiln::Mode::ReduceOverhead] {
        let step = kiln::compile(f).backend(Backend::Cuda).mode(mode);
        for _ in 0..3 {
            let out = step.call(vec![x.clone()]).unwrap();
            let value: f32 = out[0].item().unwrap();
            let grad: Vec<f32> = out[1].to_vec().unwrap();
            assert!((value - values.iter().map(|v| v * v).sum::<f32>()).abs() < 1e-4, "{mode:?}: {value}");
            assert_eq!(grad, values.iter().map(|v| 2.0 * v).collect::<Vec<f32>>(), "{mode:?}");
        }
    }
}

/// One way of training the two-rank test models: how the step runs, the model's dtype, and how the
/// ranks average.
type Variant = (kiln::Mode, kiln::DType, kiln::train::DataParallel);

/// As one rank of `kiln-run`: the per-step losses of each variant over the same shards.
fn rank_losses(variants: &[Variant]) -> Vec<Vec<f32>> {
    let group = ProcessGroup::from_env(Backend::Cuda).unwrap();
    let rt = Backend::Cuda.runtime().unwrap().expect("a device");
    let losses = |&(mode, dtype, how): &Variant| -> Vec<f32> {
        let model = kiln::nn::Module::cast(&Mlp::new(4, 16, 3, 5), dtype).unwrap();
        let model = kiln::nn::Module::to(&model, &rt).unwrap();
        let options = kiln::train::StepOptions { mode, ..Default::default() };
        // The features in the model's dtype (the loader's are f32).
        let loss = move |m: &Mlp, b: &[Tensor]| m.loss(&[b[0].cast(dtype)?, b[1].clone()]);
        let opt = AdamW { lr: 3e-2, ..AdamW::default() };
        let mut t = Trainer::with_options(model, opt, options, loss, Backend::Cuda).unwrap();
        t = t.data_parallel_with(group.clone(), how).unwrap();
        let loader = Loader::new(blobs(96, 1), PER_RANK).shuffle(Some(11)).shard(group.rank(), group.world());
        let loader = loader.to(rt.clone());
        let mut out = Vec::new();
        for epoch in 0..2 {
            for b in loader.epoch(epoch) {
                let l = t.step(&b.unwrap().tensors, 1.0).unwrap();
                out.push(l.cast(kiln::DType::F32).unwrap().item::<f32>().unwrap());
            }
        }
        group.healthy().unwrap();
        out
    };
    variants.iter().map(losses).collect()
}

/// Runs this binary's test `name` as two ranks of `kiln-run` with `flag` naming a directory, where
/// each rank writes [`rank_losses`] of `variants`; both ranks' losses (which must be equal: NCCL
/// averaged them).
fn two_rank_losses(name: &str, flag: &str, variants: &[Variant]) -> Vec<Vec<f32>> {
    if let Some(dir) = std::env::var_os(flag) {
        let line = serde_json::json!(rank_losses(variants)).to_string();
        let rank = std::env::var("RANK").unwrap();
        std::fs::write(PathBuf::from(dir).join(format!("rank{rank}.json")), line).unwrap();
        std::process::exit(0);
    }
    let dir = std::env::temp_dir().join(format!("kiln-ddp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(kiln_run())
        .args(["--gpus", "2", "--master-port", &free_port().to_string(), "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--include-ignored", "--nocapture"])
        .env(flag, &dir)
        .output()
        .unwrap();
    let said = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    let read = |r: usize| -> Vec<Vec<f32>> {
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("rank{r}.json"))).unwrap()).unwrap()
    };
    let (r0, r1) = (read(0), read(1));
    assert_eq!(r0, r1, "both ranks record the same (averaged) losses");
    let _ = std::fs::remove_dir_all(&dir);
    r0
}

/// A data-parallel step replayed as a CUDA graph (its NCCL calls captured with it) trains as the
/// launched one does: two ranks of `kiln-run`, each stepping both trainers on the same batches.
#[test]
#[ignore = "needs two NVIDIA GPUs and NCCL: run with --include-ignored on such a machine (scripts/gpu.sh nccl2)"]
fn two_gpus_a_recorded_data_parallel_step_trains_as_the_launched_one() {
    let f32 = |mode| (mode, kiln::DType::F32, kiln::train::DataParallel::default());
    let name = "two_gpus_a_recorded_data_parallel_step_trains_as_the_launched_one";
    let got =
        two_rank_losses(name, "KILN_DDP_CHILD_RECORDED", &[f32(kiln::Mode::Default), f32(kiln::Mode::ReduceOverhead)]);
    let (launched, recorded) = (&got[0], &got[1]);
    assert_eq!(launched.len(), 8);
    assert_eq!(launched, recorded, "the replayed step computes what the launched one does");
    eprintln!("losses, launched and replayed: {launched:?}");
}

/// A bf16 model whose ranks average their gradients in bf16 (`reduce_in_model_dtype`) trains as the
/// same model averaging them in f32, within what bf16's rounding of each average moves.
#[test]
#[ignore = "needs two NVIDIA GPUs and NCCL: run with --include-ignored on such a machine (scripts/gpu.sh nccl2)"]
fn two_gpus_gradients_averaged_in_bf16_train_as_averaged_in_f32() {
    let bf16 = |narrow| {
        let how = kiln::train::DataParallel { reduce_in_model_dtype: narrow };
        (kiln::Mode::Default, kiln::DType::BF16, how)
    };
    let name = "two_gpus_gradients_averaged_in_bf16_train_as_averaged_in_f32";
    let got = two_rank_losses(name, "KILN_DDP_CHILD_NARROW", &[bf16(false), bf16(true)]);
    let (wide, narrow) = (&got[0], &got[1]);
    eprintln!("losses, averaged in f32 and in bf16: {wide:?} {narrow:?}");
    assert_eq!(wide.len(), 8);
    assert!(narrow[7] < 0.5 * narrow[0], "it trains: {narrow:?}");
    for (a, b) in wide.iter().zip(narrow) {
        assert!((a - b).abs() <= 0.03 * a.abs().max(0.1), "{wide:?} vs {narrow:?}");
    }
}

/// The loop a user writes with the low-level API: join, broadcast-start, barrier, step, read the loss.
/// Rank 1 exits at its third step when asked to.
fn own_loop() -> kiln::Result<()> {
    let group = ProcessGroup::from_env(Backend::Cuda)?;
    let rt = Backend::Cuda.runtime()?.expect("a device");
    let model = kiln::nn::Module::to(&Mlp::new(4, 16, 3, 5), &rt)?;
    let opt = AdamW { lr: 3e-2, ..AdamW::default() };
    let mut trainer =
        Trainer::new(model, opt, |m: &Mlp, b: &[Tensor]| m.loss(b), Backend::Cuda)?.data_parallel(group.clone())?;
    group.barrier()?;
    let loader = Loader::new(blobs(96, 1), PER_RANK).shuffle(Some(11)).shard(group.rank(), group.world()).to(rt);
    for epoch in 0..100 {
        for b in loader.epoch(epoch) {
            let b = b?;
            if group.rank() == 1 && epoch == 0 && b.index == 2 {
                eprintln!("rank 1 goes away mid-training");
                std::process::exit(17);
            }
            eprintln!("rank {} epoch {epoch} batch {}: stepping", group.rank(), b.index);
            let loss = trainer.step(&b.tensors, 1.0)?;
            eprintln!("rank {} epoch {epoch} batch {}: reading the loss", group.rank(), b.index);
            let loss: f32 = loss.item()?;
            group.healthy()?;
            println!("rank {} epoch {epoch} batch {} loss {loss}", group.rank(), b.index);
        }
    }
    Ok(())
}

/// Starts this test binary's test `name` as both ranks of a world of two with `flag` set (directly,
/// not by `kiln-run`, which would stop rank 0 itself: NCCL must let go of it); expects rank 1 to exit
/// with 17 and rank 0 to fail by itself within the timeout plus a margin. Rank 0's stdout and stderr.
fn rank_zero_outlives_rank_one(name: &str, flag: &str) -> (String, String) {
    let port = free_port().to_string();
    let timeout_s = 10;
    let started = Instant::now();
    let mut ranks: Vec<_> = (0..2)
        .map(|r: usize| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", name, "--include-ignored", "--nocapture"])
                .env(flag, "1")
                .envs([("WORLD_SIZE", "2".to_string()), ("RANK", r.to_string()), ("LOCAL_RANK", r.to_string())])
                .envs([("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port.as_str())])
                .env("KILN_DIST_TIMEOUT_S", timeout_s.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let one = ranks.pop().unwrap().wait_with_output().unwrap();
    assert_eq!(one.status.code(), Some(17), "{}", String::from_utf8_lossy(&one.stderr));
    let mut zero = ranks.pop().unwrap();
    let limit = Duration::from_secs(timeout_s + 30);
    while zero.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = zero.kill();
            let out = zero.wait_with_output().unwrap();
            panic!(
                "rank 0 still ran {limit:?} after start:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = zero.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("rank 0 stopped after {:?}:\n{stderr}", started.elapsed());
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    (stdout.into_owned(), stderr.into_owned())
}

#[test]
#[ignore = "needs two NVIDIA GPUs and NCCL: run with --include-ignored on such a machine (scripts/gpu.sh nccl2)"]
fn two_gpus_a_rank_that_dies_mid_training_fails_the_other_within_the_timeout() {
    if std::env::var_os("KILN_DDP_CHILD_LOOP").is_some() {
        // Display, not Debug: the error as a user reads it.
        if let Err(e) = own_loop() {
            panic!("{e}");
        }
        return;
    }
    let name = "two_gpus_a_rank_that_dies_mid_training_fails_the_other_within_the_timeout";
    let (stdout, stderr) = rank_zero_outlives_rank_one(name, "KILN_DDP_CHILD_LOOP");
    assert!(stdout.contains("rank 0 epoch 0 batch 1 loss"), "rank 0 trained before rank 1 went: {stdout}");
    assert!(
        stderr.contains("distributed (rank 0)")
            && (stderr.contains("did not finish within") || stderr.contains("NCCL")),
        "{stderr}"
    );
}

/// Rank 1 passes the rendezvous (rank 0 sends it NCCL's id) and dies before joining NCCL's world:
/// rank 0, waiting in NCCL's set-up (which has no timeout of its own), fails within the world's.
#[test]
#[ignore = "needs two NVIDIA GPUs and NCCL: run with --include-ignored on such a machine (scripts/gpu.sh nccl2)"]
fn two_gpus_a_rank_that_dies_before_joining_nccl_fails_the_other_within_the_timeout() {
    if std::env::var_os("KILN_DDP_CHILD_JOIN").is_some() {
        let env = DistEnv::from_env().unwrap().expect("started as a rank");
        if env.rank == 1 {
            kiln::dist::rendezvous::rendezvous(&env, || Ok(Vec::new())).unwrap();
            eprintln!("rank 1 goes away before joining NCCL");
            std::process::exit(17);
        }
        if let Err(e) = ProcessGroup::from_env(Backend::Cuda) {
            panic!("{e}");
        }
        return;
    }
    let name = "two_gpus_a_rank_that_dies_before_joining_nccl_fails_the_other_within_the_timeout";
    let (_, stderr) = rank_zero_outlives_rank_one(name, "KILN_DDP_CHILD_JOIN");
    assert!(
        stderr.contains("distributed (rank 0)")
            && (stderr.contains("joining the NCCL world (2 ranks) did not finish within")
                || stderr.contains("ncclCommInitRank")),
        "{stderr}"
    );
}
