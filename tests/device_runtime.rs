//! Tensors live on the device: what the runtime core promises, on every device (the kernel interpreter's
//! host-memory device and wgpu in CI — lavapipe where there is no GPU — and CUDA on a GPU machine).
//! Each backend's checks run in one test, in order, because they read the device's shared counters.

mod common;

use kiln::graph::{KernelInterpreter, Runtime};
use kiln::{compile, Tensor};
use std::sync::Arc;

fn host(v: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_slice(v, dims).unwrap()
}

/// Command buffers a wgpu runtime has submitted; `None` on other devices.
fn submissions(rt: &Arc<Runtime>) -> Option<usize> {
    rt.driver().as_any().downcast_ref::<kiln_wgsl::Gpu>().map(|g| g.stats().submissions)
}

/// Inputs on the device are bound, never copied; outputs stay until read: 100 chained calls move no
/// byte between host and device after the first upload.
fn chained_calls_move_nothing(rt: &Arc<Runtime>) {
    let n = 4096;
    let x = host(&vec![1.0; n], &[n]).to(rt.clone()).unwrap();
    assert_eq!(x.device_name(), Some(rt.name()));
    let f = compile(|x: &Tensor| x.mul(0.5)?.add(1.0)).backend(rt.clone());
    let mut y: Tensor = f.call(&x).unwrap();
    rt.reset_transfers();
    let before = rt.stats();
    let submitted_before = submissions(rt);
    for _ in 0..100 {
        y = f.call(&y).unwrap();
    }
    let m = rt.memory_stats();
    assert_eq!((m.uploaded, m.downloaded), (0, 0), "{m:?}");
    // Pooled buffers come back with their identity: the calls alternate between a few, and what the
    // driver made to bind them (wgpu's bind groups) is made once for each.
    let s = rt.stats();
    assert!(s.bindings_made - before.bindings_made <= 3, "{before:?} → {s:?}");
    if rt.name() == "wgpu" {
        assert!(s.bindings_reused - before.bindings_reused >= 97, "every launch binds: {before:?} → {s:?}");
    }
    // wgpu: runs of one kernel share submissions (32 dispatches each) where each was its own.
    if let (Some(a), Some(b)) = (submitted_before, submissions(rt)) {
        assert!((1..=4).contains(&(b - a)), "100 one-kernel runs made {} submissions", b - a);
    }
    assert_eq!(y.device_name(), Some(rt.name()), "outputs stay on the device");
    // y converges to 2 (the fixed point of y/2 + 1).
    let v: Vec<f32> = y.to_vec().unwrap();
    assert_eq!(v.len(), n);
    assert!(v.iter().all(|&e| (e - 2.0).abs() < 1e-6), "{:?}", &v[..4]);
    assert_eq!(rt.memory_stats().downloaded, (n * 4) as u64, "reading it moves it once");
}

/// A captured weight crosses to the device once in 100 calls; replacing it (`assign`) is seen by the
/// next call and crosses once more.
fn weights_upload_once_and_replacements_are_seen(rt: &Arc<Runtime>) {
    let w = host(&[10.0, 20.0, 30.0, 40.0], &[4]);
    let x = host(&[1.0, 2.0, 3.0, 4.0], &[4]).to(rt.clone()).unwrap();
    let g = compile(|x: &Tensor| x.add(&w)).backend(rt.clone());
    rt.reset_transfers();
    let mut last = None;
    for _ in 0..100 {
        last = Some(g.call(&x).unwrap());
    }
    assert_eq!(rt.memory_stats().uploaded, 16, "the weight's 16 bytes, once: {:?}", rt.memory_stats());
    assert_eq!(last.unwrap().to_vec::<f32>().unwrap(), vec![11.0, 22.0, 33.0, 44.0]);
    w.assign(&host(&[0.5, 0.5, 0.5, 0.5], &[4])).unwrap();
    rt.reset_transfers();
    let y: Tensor = g.call(&x).unwrap();
    let z: Tensor = g.call(&x).unwrap();
    assert_eq!(rt.memory_stats().uploaded, 16, "the new weight crosses once");
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.5, 2.5, 3.5, 4.5]);
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![1.5, 2.5, 3.5, 4.5]);
    assert!(w.assign(&host(&[1.0; 3], &[3])).is_err(), "a replacement keeps the shape");
}

/// One compiled function called from 8 threads, 200 calls each, on their own inputs: every result right.
fn many_threads_share_one_compiled_function(rt: &Arc<Runtime>) {
    let w = host(&[2.0; 8], &[8]);
    let f = compile(|x: &Tensor| x.mul(&w)?.sum(&[0], false)).backend(rt.clone());
    std::thread::scope(|s| {
        for t in 0..8 {
            let (f, rt) = (&f, rt.clone());
            s.spawn(move || {
                for i in 0..200 {
                    let v = (t * 1000 + i) as f32;
                    let x = host(&[v; 8], &[8]).to(rt.clone()).unwrap();
                    let y: f32 = f.call(&x).unwrap().item().unwrap();
                    assert_eq!(y, 16.0 * v, "thread {t} call {i}");
                }
            });
        }
    });
    let s = f.stats();
    assert_eq!(s.calls, 1600, "{s:?}");
    assert!(s.traces <= 8 && s.cache_hits >= 1500, "threads reuse the entry: {s:?}");
}

/// Dropping every tensor returns the device memory to the pool: in use is back where it started.
fn dropped_tensors_return_memory(rt: &Arc<Runtime>) {
    let start = rt.memory_stats().in_use;
    {
        let x = host(&vec![1.0; 1 << 16], &[1 << 16]).to(rt.clone()).unwrap();
        let f = compile(|x: &Tensor| x.exp()?.softmax(-1)).backend(rt.clone());
        let ys: Vec<Tensor> = (0..10).map(|_| f.call(&x).unwrap()).collect();
        assert!(rt.memory_stats().in_use > start);
        // explain shows the device's memory next to what was compiled.
        let (_, ex) = f.call_explained(&x).unwrap();
        assert!(ex.memory.is_some_and(|m| m.in_use > start), "{ex}");
        assert!(ex.to_string().contains("device memory:"), "{ex}");
        drop(ys);
    }
    assert_eq!(rt.memory_stats().in_use, start, "{:?}", rt.memory_stats());
    assert!(rt.memory_stats().cached > 0, "freed buffers wait in the pool for reuse");
}

/// A device tensor read without blocking (what a browser must do) gives what the blocking read gives.
fn reads_without_blocking(rt: &Arc<Runtime>) {
    let x = host(&[1.0, 2.0, 3.0], &[3]).to(rt.clone()).unwrap();
    let y: Tensor = compile(|x: &Tensor| x.mul(3.0)).backend(rt.clone()).call(&x).unwrap();
    assert_eq!(pollster::block_on(y.to_vec_async::<f32>()).unwrap(), vec![3.0, 6.0, 9.0]);
    // The device's own time of a call, awaited: where the device times itself, a figure, and the work
    // is done once it is known (its result reads without a wait of its own).
    let f = compile(|x: &Tensor| x.sin()?.mul(2.0)).backend(rt.clone());
    let mut out = None;
    let timed = pollster::block_on(rt.time_async(&mut || {
        out = Some(f.call(&x)?);
        Ok(())
    }))
    .unwrap();
    match rt.timing() {
        "fenced wall time" => assert_eq!(timed, None, "{} cannot time itself", rt.name()),
        how => assert!(timed.is_some_and(|s| s > 0.0 && s < 1.0), "{}: {how}: {timed:?}", rt.name()),
    }
    let out: Tensor = out.expect("called");
    let want = [1.0f32, 2.0, 3.0].map(|v| v.sin() * 2.0);
    assert!(out.to_vec::<f32>().unwrap().iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-5), "{out:?}");
}

/// A failed run-time check is reported to whoever reads a result that depends on it — also through a
/// later call — and to nobody else (a server's other requests go on).
fn failed_checks_reach_only_their_readers(rt: &Arc<Runtime>) {
    let x = host(&[1.0, 2.0, 3.0], &[3]).to(rt.clone()).unwrap();
    let select = compile(|(x, i): (&Tensor, &Tensor)| x.index_select(0, i)).backend(rt.clone());
    let double = compile(|y: &Tensor| y.mul(2.0)).backend(rt.clone());
    let bad_idx = Tensor::from_slice(&[0i64, 7], &[2]).unwrap().to(rt.clone()).unwrap();
    let good_idx = Tensor::from_slice(&[2i64, 0], &[2]).unwrap().to(rt.clone()).unwrap();
    let bad: Tensor = select.call((&x, &bad_idx)).unwrap();
    let good: Tensor = select.call((&x, &good_idx)).unwrap();
    let later: Tensor = double.call(&bad).unwrap();
    assert_eq!(good.to_vec::<f32>().unwrap(), vec![3.0, 1.0], "another call's bad index is not this one's error");
    assert!(matches!(later.to_data(), Err(kiln::Error::Runtime { .. })), "a result computed from a bad one reports it");
    assert!(matches!(bad.to_data(), Err(kiln::Error::Runtime { .. })));
    assert_eq!(double.call(&good).unwrap().to_vec::<f32>().unwrap(), vec![6.0, 2.0]);
}

/// Eager ops on device tensors run on that device (as in PyTorch), with no eager backend set: their
/// results stay there and nothing crosses to the host until read.
fn eager_ops_run_where_their_inputs_live(rt: &Arc<Runtime>) {
    let x = host(&[1.0, -2.0, 3.0, -4.0], &[4]).to(rt.clone()).unwrap();
    rt.reset_transfers();
    let runs = rt.stats().runs;
    let y = x.mul(2.0).unwrap().relu().unwrap().add(&x).unwrap();
    assert_eq!(y.device_name(), Some(rt.name()), "eager results stay on the device");
    assert_eq!(rt.stats().runs - runs, 3, "one kernel per eager op, on this device");
    let m = rt.memory_stats();
    assert_eq!((m.uploaded, m.downloaded), (0, 0), "{m:?}");
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0, -2.0, 9.0, -4.0]);
    // A constant made like a device tensor (`new_full`) is made there: nothing is uploaded.
    rt.reset_transfers();
    let c = x.new_full(&[3], 2.5).unwrap();
    assert_eq!((c.device_name(), rt.memory_stats().uploaded), (Some(rt.name()), 0));
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![2.5; 3]);
}

/// A reduce-overhead function's recording holds device buffers; dropping the function returns them.
fn dropping_a_reduce_overhead_function_frees_its_recording(rt: &Arc<Runtime>) {
    let x = host(&[1.0; 1024], &[1024]).to(rt.clone()).unwrap();
    let before = rt.memory_stats().in_use;
    {
        let f = compile(|x: &Tensor| x.mul(3.0)?.add(1.0)).backend(rt.clone()).mode(kiln::Mode::ReduceOverhead);
        for _ in 0..3 {
            let y: Tensor = f.call(&x).unwrap();
            assert_eq!(y.to_vec::<f32>().unwrap()[0], 4.0);
        }
        assert!(rt.memory_stats().in_use > before, "the recording holds its buffers while the function lives");
    }
    assert_eq!(rt.memory_stats().in_use, before, "and gives them back when it is dropped");
}

/// Reduce-overhead outputs are the recording's own buffers while each call's outputs are dropped before
/// the next call (nothing is copied); an output kept across a later call keeps its values (the recording
/// is made again, and copies its outputs out from then on), and chaining outputs into inputs stays right.
fn reduce_overhead_never_overwrites_a_held_output(rt: &Arc<Runtime>) {
    let f = compile(|x: &Tensor| x.mul(3.0)?.add(1.0)).backend(rt.clone()).mode(kiln::Mode::ReduceOverhead);
    let at = |v: f32| host(&[v; 256], &[256]).to(rt.clone()).unwrap();
    let first = |t: &Tensor| t.to_vec::<f32>().unwrap()[0];
    let before = rt.stats();
    // New tensors every call: the first call traces, the second checks the trace again for new tensor
    // identities, then calls replay.
    for v in 0..5 {
        assert_eq!(first(&f.call(&at(v as f32)).unwrap()), 3.0 * v as f32 + 1.0);
    }
    let s = rt.stats();
    assert_eq!(s.replay_output_copies, before.replay_output_copies, "dropped outputs are not copied: {s:?}");
    let kept: Tensor = f.call(&at(10.0)).unwrap();
    let next: Tensor = f.call(&at(20.0)).unwrap();
    assert_eq!((first(&kept), first(&next)), (31.0, 61.0), "the kept output was not overwritten");
    assert!(rt.stats().replay_output_copies > s.replay_output_copies, "{:?}", rt.stats());
    let mut y = next;
    for _ in 0..3 {
        y = f.call(&y).unwrap();
    }
    assert_eq!((first(&y), first(&kept)), (1660.0, 31.0), "61 → 184 → 553 → 1660, the kept one untouched");
}

/// An optimizer-like step: a loss, then the weights and the moment updated from a batch.
fn sgd_momentum_step(a: Vec<Tensor>) -> kiln::Result<Vec<Tensor>> {
    let (w, m, x) = (&a[0], &a[1], &a[2]);
    let m2 = m.mul(0.9)?.add(&x.mul(w)?)?;
    let w2 = w.add(&m2.mul(-0.01)?)?;
    Ok(vec![w.mul(x)?.sum(&[0], false)?, w2, m2])
}

/// Runs `steps` of [`sgd_momentum_step`] in `mode`, feeding the state back, a new batch each step, every
/// loss kept. Returns the losses, the final weights, the state step `keep` started from (held by the caller
/// all along) and each step's input copies, output copies and runs on the device. Step `doubled`, if
/// given, starts from the state doubled instead (new buffers), the caller keeping the old one too.
fn sgd_momentum_run(rt: &Arc<Runtime>, mode: kiln::Mode, steps: usize, keep: usize, doubled: Option<usize>) -> SgdRun {
    let n = 1024;
    let f = compile(sgd_momentum_step).backend(rt.clone()).mode(mode);
    let batch = |i: usize| (0..n).map(|j| ((i * 7 + j) % 13) as f32 / 13.0 - 0.4).collect::<Vec<f32>>();
    let mut state =
        vec![host(&vec![0.5; n], &[n]).to(rt.clone()).unwrap(), host(&vec![0.0; n], &[n]).to(rt.clone()).unwrap()];
    let (mut losses, mut kept, mut copies) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..steps {
        let x = host(&batch(i), &[n]).to(rt.clone()).unwrap();
        if i == keep {
            kept.extend(state.iter().cloned());
        }
        if Some(i) == doubled {
            kept.extend(state.iter().cloned());
            state = state.iter().map(|t| t.mul(2.0).unwrap()).collect();
        }
        let before = rt.stats();
        let mut out: Vec<Tensor> = f.call([state, vec![x]].concat()).unwrap();
        let s = rt.stats();
        copies.push((
            s.replay_input_copies - before.replay_input_copies,
            s.replay_output_copies - before.replay_output_copies,
            s.runs - before.runs,
        ));
        state = out.split_off(1);
        losses.push(out.remove(0));
    }
    let read = |t: &Tensor| t.to_vec::<f32>().unwrap();
    SgdRun {
        losses: losses.iter().map(|l| l.item::<f32>().unwrap()).collect(),
        weights: read(&state[0]),
        kept: kept.iter().map(read).collect(),
        copies,
    }
}

/// What [`sgd_momentum_run`] saw.
struct SgdRun {
    losses: Vec<f32>,
    weights: Vec<f32>,
    kept: Vec<Vec<f32>>,
    copies: Vec<(u64, u64, u64)>,
}

/// A step whose outputs are its next call's inputs (an optimizer's state) ping-pongs between two
/// recordings: once both are made, no state is copied in or out — at most the batch (a new buffer each
/// step) is copied in and the loss the caller keeps copied out. Every step equals the launched
/// function's bit for bit, and a state the caller kept from an earlier step is never overwritten. The
/// first run keeps the state its first recorded step started from (step 2: the first two calls trace)
/// all along, as a caller holding the model it started from does: its recordings cannot write there,
/// and settle all the same.
fn reduce_overhead_steps_feed_their_state_back_without_copies(rt: &Arc<Runtime>) {
    let steps = 12;
    let launched = sgd_momentum_run(rt, kiln::Mode::Default, steps, 2, None);
    let replayed = sgd_momentum_run(rt, kiln::Mode::ReduceOverhead, steps, 2, None);
    assert_eq!(replayed.losses, launched.losses);
    assert_eq!(replayed.weights, launched.weights);
    eprintln!("{}: (copied in, copied out, runs) per step {:?}", rt.name(), replayed.copies);
    for (i, &(copied_in, copied_out, runs)) in replayed.copies.iter().enumerate().skip(5) {
        // A second run in a call is a recording's first (plain) run: a step recorded again.
        assert!(copied_in <= 1 && copied_out <= 1 && runs == 1, "step {i} copied or recorded: {:?}", replayed.copies);
    }
    // The caller keeps the state step 5 started from while the run goes on: its buffers are left alone.
    let launched = sgd_momentum_run(rt, kiln::Mode::Default, steps, 5, None);
    let held = sgd_momentum_run(rt, kiln::Mode::ReduceOverhead, steps, 5, None);
    assert_eq!((&held.losses, &held.weights), (&launched.losses, &launched.weights));
    assert!(held.kept == launched.kept, "the kept state was overwritten");
    // Or, its first recorded state held (so one recording of the pair reads its state from buffers of
    // its own, which the other writes), keeps the state of a later step and goes on from another (new
    // buffers): copying that one in must not land in buffers the caller holds. Once each parity.
    for at in [7, 8] {
        let launched = sgd_momentum_run(rt, kiln::Mode::Default, steps, 2, Some(at));
        let swapped = sgd_momentum_run(rt, kiln::Mode::ReduceOverhead, steps, 2, Some(at));
        assert!(swapped.losses == launched.losses && swapped.weights == launched.weights, "at {at}");
        assert!(swapped.kept == launched.kept, "the state kept at step {at} was overwritten");
    }
}

/// Empty inputs in new buffers every call (nothing to copy into a recording's own) replay to empty
/// outputs, beside a non-empty input that is copied.
fn reduce_overhead_takes_empty_inputs(rt: &Arc<Runtime>) {
    let f = compile(|(e, x): (&Tensor, &Tensor)| Ok((e.mul(2.0)?, x.add(1.0)?)))
        .backend(rt.clone())
        .mode(kiln::Mode::ReduceOverhead);
    for k in 0..5 {
        let e = host(&[], &[0, 3]).to(rt.clone()).unwrap();
        let x = host(&[k as f32; 4], &[4]).to(rt.clone()).unwrap();
        let (a, b): (Tensor, Tensor) = f.call((&e, &x)).unwrap();
        let a = a.to_data().unwrap();
        assert_eq!((a.dims().to_vec(), a.values().len()), (vec![0, 3], 0));
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![k as f32 + 1.0; 4]);
    }
}

/// A function called all along keeps its recording while more functions than the runtime keeps
/// recordings for (16) come and stay: the least recently used recording goes, not the oldest.
fn a_busy_recording_outlives_idle_ones(rt: &Arc<Runtime>) {
    let x = host(&[1.5; 256], &[256]).to(rt.clone()).unwrap();
    let mode = kiln::Mode::ReduceOverhead;
    let busy = compile(|x: &Tensor| x.mul(2.0)?.exp()).backend(rt.clone()).mode(mode);
    for _ in 0..3 {
        let _: Tensor = busy.call(&x).unwrap();
    }
    let mut idle = Vec::new();
    for k in 0..20 {
        let f = compile(move |x: &Tensor| x.mul(k as f64 + 3.0)?.sin()).backend(rt.clone()).mode(mode);
        for _ in 0..3 {
            let _: Tensor = f.call(&x).unwrap();
        }
        idle.push(f);
        let before = rt.stats().runs;
        let y: Tensor = busy.call(&x).unwrap();
        assert_eq!(rt.stats().runs - before, 1, "the busy function recorded again after {} others", k + 1);
        assert!((y.to_vec::<f32>().unwrap()[0] - 3.0f32.exp()).abs() < 1e-5 * 3.0f32.exp());
    }
}

/// One thread records reduce-overhead functions over and over (a fresh function each time, so each call
/// records) while another allocates, uploads, frees (`trim`) and reads: neither sees the other's work
/// (on CUDA, an allocation or a free issued during another thread's capture would be recorded into its
/// graph instead of done).
fn recording_while_another_thread_allocates_and_frees(rt: &Arc<Runtime>) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let before = rt.stats().recordings;
    std::thread::scope(|s| {
        let churn = s.spawn(|| {
            let mut rounds = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || rounds < 20 {
                let n = 256 << (rounds % 6);
                let v: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
                let t = host(&v, &[n]).to(rt.clone()).unwrap();
                assert_eq!(t.to_vec::<f32>().unwrap(), v, "round {rounds}");
                drop(t);
                rt.trim();
                rounds += 1;
            }
            rounds
        });
        for i in 0..40 {
            let f = compile(|x: &Tensor| x.mul(2.0)?.add(1.0)).backend(rt.clone()).mode(kiln::Mode::ReduceOverhead);
            let x = host(&[i as f32; 512], &[512]).to(rt.clone()).unwrap();
            for _ in 0..3 {
                let y: Tensor = f.call(&x).unwrap();
                assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0 * i as f32 + 1.0; 512], "function {i}");
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(churn.join().unwrap() >= 20);
    });
    if rt.name() == "cuda" {
        assert!(rt.stats().recordings - before >= 40, "every function recorded: {:?}", rt.stats());
    }
}

/// A model's repeated layers are one module each however many there are: once one layer (a product
/// with its own weights, then a softmax) has run, four such layers launch eight kernels and load no
/// module (the layers' kernels differ only in their names and the graph values their buffers hold).
fn repeated_layers_load_one_module_each(rt: &Arc<Runtime>) {
    let w = |i: usize| host(&(0..64).map(|j| ((i * 64 + j) % 7) as f32 / 7.0).collect::<Vec<_>>(), &[8, 8]);
    let ws: Vec<Tensor> = (0..4).map(|i| w(i).to(rt.clone()).unwrap()).collect();
    let x = host(&(0..32).map(|i| i as f32 / 32.0).collect::<Vec<_>>(), &[4, 8]).to(rt.clone()).unwrap();
    let layers = |n: usize| {
        let ws = &ws[..n];
        compile(move |x: &Tensor| ws.iter().try_fold(x.clone(), |h, w| h.matmul(w)?.softmax(-1))).backend(rt.clone())
    };
    let _: Tensor = layers(1).call(&x).unwrap();
    let before = rt.stats();
    let y: Tensor = layers(4).call(&x).unwrap();
    let s = rt.stats();
    assert!(s.launches - before.launches >= 8, "{before:?} → {s:?}");
    assert_eq!(s.modules_loaded - before.modules_loaded, 0, "{before:?} → {s:?}");
    let rows: Vec<f32> = y.to_vec().unwrap();
    assert!(rows.chunks(8).all(|r| (r.iter().sum::<f32>() - 1.0).abs() < 1e-5), "{rows:?}");
}

fn all(rt: &Arc<Runtime>) {
    repeated_layers_load_one_module_each(rt);
    recording_while_another_thread_allocates_and_frees(rt);
    reduce_overhead_never_overwrites_a_held_output(rt);
    reduce_overhead_steps_feed_their_state_back_without_copies(rt);
    a_busy_recording_outlives_idle_ones(rt);
    reduce_overhead_takes_empty_inputs(rt);
    dropping_a_reduce_overhead_function_frees_its_recording(rt);
    eager_ops_run_where_their_inputs_live(rt);
    failed_checks_reach_only_their_readers(rt);
    reads_without_blocking(rt);
    chained_calls_move_nothing(rt);
    weights_upload_once_and_replacements_are_seen(rt);
    many_threads_share_one_compiled_function(rt);
    dropped_tensors_return_memory(rt);
}

#[test]
fn on_the_kernel_interpreter() {
    all(&KernelInterpreter::default().runtime());
}

#[test]
fn on_wgpu() {
    if common::wgpu_skipped() {
        return;
    }
    let rt = kiln::Backend::Wgpu.runtime().unwrap_or_else(|e| panic!("{e}")).expect("wgpu has a runtime");
    all(&rt);
}

/// Every wgpu adapter is a backend of its own (the explorer runs on each); one runtime per adapter per
/// process, so `Wgpu` and the adapter it chose share theirs, and an adapter that is not there is a typed
/// error.
#[test]
fn each_wgpu_adapter_is_a_backend() {
    if common::wgpu_skipped() {
        return;
    }
    let adapters = kiln::wgpu_adapters();
    assert!(!adapters.is_empty(), "no wgpu adapter: install Mesa's Vulkan drivers, or set KILN_WGPU_TESTS=skip");
    let best = kiln::Backend::Wgpu.runtime().unwrap_or_else(|e| panic!("{e}")).expect("a runtime");
    let first: kiln::Backend = "wgpu:0".parse().unwrap();
    assert_eq!(first, kiln::Backend::WgpuAdapter(0));
    assert_eq!(first.to_string(), "wgpu:0");
    let rt = first.runtime().unwrap_or_else(|e| panic!("{e}")).expect("a runtime");
    if std::env::var_os("KILN_WGPU_ADAPTER").is_none() {
        assert!(Arc::ptr_eq(&rt, &best), "adapter 0 is the best one, opened once: {adapters:?}");
    }
    if adapters.len() > 1 {
        let second = kiln::Backend::WgpuAdapter(1).runtime().unwrap_or_else(|e| panic!("{e}")).expect("a runtime");
        assert!(!Arc::ptr_eq(&rt, &second), "each adapter has its own runtime: {adapters:?}");
    }
    let y: Tensor = compile(|x: &Tensor| x.mul(2.0)).backend(first).call(&host(&[1.0, 2.5], &[2])).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 5.0]);
    let missing = kiln::Backend::WgpuAdapter(adapters.len()).runtime();
    assert!(
        matches!(&missing, Err(kiln::Error::Backend { msg, .. }) if msg.contains("no wgpu adapter")),
        "{missing:?}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with a CUDA driver (scripts/test.sh does)"]
fn on_cuda() {
    let rt = kiln::Backend::Cuda.runtime().unwrap_or_else(|e| panic!("{e}")).expect("CUDA has a runtime");
    all(&rt);
    // Asking for more than the device has is a typed error naming the buffer; the device goes on.
    let r = compile(|x: &Tensor| Tensor::zeros(&[1 << 40], kiln::DType::F32)?.add(x))
        .backend(rt.clone())
        .call(&host(&[1.0], &[1]));
    assert!(matches!(r, Err(kiln::Error::OutOfMemory { .. })), "{r:?}");
    chained_calls_move_nothing(&rt);
}

/// Tensors and compiled functions cross threads.
#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tensor>();
    check::<kiln::Compiled<fn(&Tensor) -> kiln::Result<Tensor>>>();
    check::<Runtime>();
}
