//! NCCL as kiln loads and calls it: a missing library is an error that says where kiln looked and how to
//! install it; on a GPU, a one-rank communicator sums and broadcasts in place (the collectives
//! data-parallel training runs, through the same bindings).

use kiln_ptx::nccl::{load_from, nccl, Comm, DataType};
use std::path::PathBuf;

#[test]
fn a_missing_nccl_says_where_it_looked_and_how_to_install_it() {
    let tried = [PathBuf::from("/nonexistent/libnccl.so.2"), PathBuf::from("libnccl-not-here.so.2")];
    let e = load_from(&tried).err().expect("no NCCL there");
    for says in [
        "NCCL was not found",
        "/nonexistent/libnccl.so.2",
        "libnccl-not-here.so.2",
        "apt install libnccl2",
        "KILN_NCCL_LIB",
    ] {
        assert!(e.contains(says), "{says}: {e}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"]
fn a_one_rank_communicator_sums_and_broadcasts_in_place() {
    use cudarc::driver::{CudaContext, DevicePtr};
    let lib = nccl().expect("NCCL on the GPU machine");
    assert!(lib.version >= 21800, "NCCL {} at {}", lib.version, lib.path);
    eprintln!("NCCL {} from {}", lib.version, lib.path);
    let ctx = CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    let stream = ctx.new_stream().unwrap();
    let host = [1.5f32, -2.0, 3.25, 4.0];
    let dev = stream.clone_htod(&host).unwrap();
    let comm = Comm::init(1, 0, lib.unique_id().unwrap()).unwrap();
    let (ptr, _guard) = dev.device_ptr(&stream);
    // SAFETY: `dev` holds four f32 on this device and outlives the synchronisation below.
    unsafe {
        comm.all_reduce_sum(ptr, 4, DataType::F32, stream.cu_stream() as *mut _).unwrap();
        comm.broadcast(ptr, 4, DataType::F32, 0, stream.cu_stream() as *mut _).unwrap();
    }
    drop(_guard);
    stream.synchronize().unwrap();
    assert_eq!(stream.clone_dtoh(&dev).unwrap(), host, "one rank: the sum and the broadcast are the input");
}

/// Two GPUs, one communicator rank each (a thread per device, as two processes would): every rank's
/// in-place sum is the sum over both, and a broadcast from rank 1 reaches rank 0 — the all-reduce
/// data-parallel training runs on, over the host's NVLink.
#[test]
#[ignore = "needs two NVIDIA GPUs: run with --include-ignored on such a machine (scripts/gpu.sh nccl2)"]
fn two_gpus_sum_and_broadcast_across_devices() {
    use cudarc::driver::{CudaContext, DevicePtr};
    let lib = nccl().expect("NCCL on the GPU machine");
    let id = lib.unique_id().unwrap();
    let n = 1 << 20;
    let ranks: Vec<_> = (0..2usize)
        .map(|rank| {
            std::thread::spawn(move || {
                let ctx = CudaContext::new(rank).unwrap();
                ctx.bind_to_thread().unwrap();
                let stream = ctx.new_stream().unwrap();
                let mine: Vec<f32> = (0..n).map(|i| (rank + 1) as f32 * (i % 7) as f32).collect();
                let dev = stream.clone_htod(&mine).unwrap();
                let comm = Comm::init(2, rank, id).unwrap();
                let (ptr, guard) = dev.device_ptr(&stream);
                // SAFETY: `dev` holds n f32 on this device and outlives the synchronisation below.
                unsafe { comm.all_reduce_sum(ptr, n, DataType::F32, stream.cu_stream() as *mut _).unwrap() };
                drop(guard);
                stream.synchronize().unwrap();
                let summed = stream.clone_dtoh(&dev).unwrap();
                let start = std::time::Instant::now();
                let (ptr, guard) = dev.device_ptr(&stream);
                // SAFETY: as above.
                unsafe { comm.broadcast(ptr, n, DataType::F32, 1, stream.cu_stream() as *mut _).unwrap() };
                drop(guard);
                stream.synchronize().unwrap();
                let took = start.elapsed();
                (summed, stream.clone_dtoh(&dev).unwrap(), took)
            })
        })
        .collect();
    let results: Vec<_> = ranks.into_iter().map(|t| t.join().unwrap()).collect();
    for (rank, (summed, broadcast, took)) in results.iter().enumerate() {
        let want_sum: Vec<f32> = (0..n).map(|i| 3.0 * (i % 7) as f32).collect();
        assert_eq!(summed, &want_sum, "rank {rank}'s sum");
        let want_bcast: Vec<f32> = want_sum.clone();
        assert_eq!(broadcast, &want_bcast, "rank {rank}: rank 1's (summed) values");
        eprintln!("rank {rank}: 4 MiB broadcast in {took:?}");
    }
}
