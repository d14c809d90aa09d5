//! The conformance suite, written once and instantiated per backend (`conformance_suite!`): every op
//! across dtypes and awkward shapes, edge cases (empty and size-1 dims, huge grids, NaN and Inf), and
//! random programs, each compared with the CPU reference.
#![allow(dead_code)]

pub mod compiled_backward;
pub mod ops;
pub mod user_cases;

use kiln::graph::{compile, Backend, CpuReference, DType, Dynamic, Result, Tensor};
use proptest::prelude::*;
use std::sync::Arc;

/// Instantiates the suite for a backend: `backend = $make`, where `$make` is an expression giving `Option<Arc<dyn Backend>>`
/// (`None` only when the caller explicitly opted out of this backend). Attributes before it (such as
/// `#[ignore = "needs a GPU"]`) go on every test, so a suite that cannot run here shows as ignored.
#[macro_export]
macro_rules! conformance_suite {
    ($(#[$attr:meta])* backend = $make:expr, random_cases = $n:expr, big = $big:expr, ieee_nan = $nan:expr) => {
        fn backend() -> Option<std::sync::Arc<dyn kiln::graph::Backend>> {
            $make
        }

        #[test]
        $(#[$attr])*
        fn every_op_matches_the_reference() {
            let Some(b) = backend() else { return };
            conformance::ops::every_op(&b);
        }

        #[test]
        $(#[$attr])*
        fn edge_cases_match_the_reference() {
            let Some(b) = backend() else { return };
            conformance::ops::edge_cases(&b, $big, $nan);
        }

        #[test]
        $(#[$attr])*
        fn aliased_arguments_are_not_merged() {
            let Some(b) = backend() else { return };
            conformance::user_cases::aliased_arguments(&b);
        }

        #[test]
        $(#[$attr])*
        fn an_argument_that_is_a_captured_weight() {
            let Some(b) = backend() else { return };
            conformance::user_cases::argument_that_is_a_captured_weight(&b);
        }

        #[test]
        $(#[$attr])*
        fn run_time_checks_are_typed_errors() {
            let Some(b) = backend() else { return };
            conformance::user_cases::run_time_checks(&b);
        }

        #[test]
        $(#[$attr])*
        fn dynamic_dims_reshape_and_broadcast() {
            let Some(b) = backend() else { return };
            conformance::user_cases::dynamic_reshapes(&b);
            conformance::user_cases::broadcast_errors_show_sizes(&b);
        }

        #[test]
        $(#[$attr])*
        fn a_saved_graph_returning_its_input_runs_in_both_modes() {
            let Some(b) = backend() else { return };
            conformance::user_cases::output_is_an_input(&b);
        }

        #[test]
        $(#[$attr])*
        fn non_finite_constants_are_not_conflated() {
            let Some(b) = backend() else { return };
            conformance::user_cases::non_finite_constants(&b);
        }

        #[test]
        $(#[$attr])*
        fn huge_sizes_are_typed_errors() {
            let Some(b) = backend() else { return };
            conformance::user_cases::huge_sizes(&b);
        }

        #[test]
        $(#[$attr])*
        fn linear_epilogues_match_the_reference() {
            let Some(b) = backend() else { return };
            conformance::user_cases::linear_epilogues(&b);
        }

        #[test]
        $(#[$attr])*
        fn small_kernels_share_a_launch() {
            let Some(b) = backend() else { return };
            conformance::user_cases::combined_launches(&b);
        }

        #[test]
        $(#[$attr])*
        fn attention_matches_the_reference() {
            let Some(b) = backend() else { return };
            conformance::user_cases::attention(&b);
        }

        #[test]
        $(#[$attr])*
        fn attention_gradients_match_the_reference() {
            let Some(b) = backend() else { return };
            conformance::user_cases::attention_gradients(&b);
        }

        #[test]
        $(#[$attr])*
        fn backward_inside_compile_matches_eager() {
            let Some(b) = backend() else { return };
            conformance::compiled_backward::compiled_backward(&b);
            conformance::compiled_backward::compiled_train_loop(&b);
        }

        #[test]
        $(#[$attr])*
        fn assigned_and_captured_tensors_are_read_at_each_call() {
            let Some(b) = backend() else { return };
            conformance::compiled_backward::assigned_and_captured_tensors(&b);
        }

        #[test]
        $(#[$attr])*
        fn regressions_match_the_reference() {
            let Some(b) = backend() else { return };
            conformance::regressions(&b);
        }

        #[test]
        $(#[$attr])*
        fn random_graphs_match_the_reference() {
            let Some(b) = backend() else { return };
            conformance::random_graphs(&b, $n, $nan, file!());
        }

        /// A tenth as many random programs again, differentiated: their joint value-and-gradient graphs.
        #[test]
        $(#[$attr])*
        fn random_gradients_match_the_reference() {
            let Some(b) = backend() else { return };
            conformance::random_gradients(&b, $n / 10, $nan, file!());
        }
    };
}

/// Workload `w` at its check sizes on `backend`, every output against the reference within the graph's
/// tolerance; returns how many outputs it checked.
pub fn workload_matches_the_reference(backend: &Arc<dyn Backend>, w: &kiln::graph::workloads::Workload) -> usize {
    use kiln::graph::tolerance::{compare, Expected, Tolerance};
    let specs = &w.check;
    let g = kiln::graph::capture(specs, w.f).unwrap();
    let tol = Tolerance::of(&g).unwrap();
    let inputs: Vec<Tensor> = kiln::graph::workloads::inputs(specs).into_iter().map(Tensor::from_data).collect();
    let f = |x: Vec<Tensor>| (w.f)(&x);
    let got: Vec<Tensor> =
        compile(f).backend(backend.clone()).call(inputs.clone()).unwrap_or_else(|e| panic!("{}: {e}", w.id));
    let want: Vec<Tensor> = compile(f).backend(CpuReference).call(inputs).unwrap();
    for (i, (g, wnt)) in got.iter().zip(&want).enumerate() {
        let outcome = compare(&g.to_data().unwrap(), &Expected::of(&wnt.to_data().unwrap(), "reference"), tol);
        assert!(outcome.correct, "{} output {i}: {outcome:?}", w.id);
    }
    got.len()
}

/// `cases` random programs (two inputs of random dims, 1 to 7 steps) checked on `backend` against the
/// reference, drawn from `PROPTEST_RNG_SEED` when set; failures persist beside `file` as proptest's do.
/// The count is written to the test's stderr (not captured), so CI output shows what ran.
pub fn random_graphs(backend: &Arc<dyn Backend>, cases: u32, ieee_nan: bool, file: &'static str) {
    run_random("random graphs", backend, cases, file, |da, db, seed, steps| {
        check(da, db, seed, steps, backend, ieee_nan)
    });
}

/// `cases` random programs differentiated: each one's loss (a weighted sum of its outputs) and its
/// gradients with respect to both inputs, traced as one joint graph (as a compiled training step is) and
/// checked on `backend` against the reference's run of the same differentiation. The backward graphs
/// bring what forward programs rarely do: sums over broadcast axes, scatters of slices and
/// concatenations, transposed matmuls, masks from comparisons. Counted on stderr like [`random_graphs`].
pub fn random_gradients(backend: &Arc<dyn Backend>, cases: u32, ieee_nan: bool, file: &'static str) {
    run_random("random gradients", backend, cases, file, |da, db, seed, steps| {
        check_gradients(da, db, seed, steps, backend, ieee_nan)
    });
}

/// Runs `check` on `cases` random programs and prints how many ran, where, how long and under which seed.
fn run_random(
    what: &str,
    backend: &Arc<dyn Backend>,
    cases: u32,
    file: &'static str,
    check: impl Fn(&[usize], &[usize], u32, &[Step]) -> std::result::Result<(), TestCaseError>,
) {
    use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let config = Config {
        cases,
        source_file: Some(file),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel("proptest-regressions"))),
        // Programs not compared (a symbolic trace that took other steps, a NaN where the backend does not
        // promise IEEE specials) are drawn again.
        max_global_rejects: cases.max(1024),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let ran = AtomicUsize::new(0);
    let strategy = (dims(), dims(), any::<u32>(), prop::collection::vec(step(), 1..8));
    let started = std::time::Instant::now();
    let result = runner.run(&strategy, |(da, db, seed, steps)| {
        ran.fetch_add(1, Ordering::Relaxed);
        check(&da, &db, seed, &steps)
    });
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "{what}: {} checked on {} in {:.1} s ({} passing cases asked for; seed {})",
        ran.load(Ordering::Relaxed),
        backend.name(),
        started.elapsed().as_secs_f64(),
        cases,
        std::env::var("PROPTEST_RNG_SEED").unwrap_or_else(|_| "random".into()),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The program's loss, `Σ_k (k + 1) · sum(tanh(output_k))`, and its gradients with respect to both
/// inputs (tanh keeps the loss bounded; the weights keep the outputs' gradients apart).
fn loss_and_gradients(inputs: &[Tensor], steps: &[Step]) -> Result<Vec<Tensor>> {
    let (loss, grads) = kiln::value_and_grad(
        |t| {
            let mut total: Option<Tensor> = None;
            for (k, out) in program(t, steps)?.iter().enumerate() {
                let term = out.tanh()?.sum(&[], false)?.mul((k + 1) as f64)?;
                total = Some(match total {
                    Some(acc) => acc.add(&term)?,
                    None => term,
                });
            }
            total.ok_or_else(|| kiln::Error::Unsupported {
                what: "no outputs".into(),
                loc: kiln::graph::SourceLoc::internal(),
            })
        },
        inputs,
        &[0, 1],
    )?;
    Ok(std::iter::once(loss).chain(grads).collect())
}

/// [`check`] for [`loss_and_gradients`]: a program the reference cannot differentiate (an op without a
/// gradient rule, an out-of-range index) is not compared.
fn check_gradients(
    dims_a: &[usize],
    dims_b: &[usize],
    seed: u32,
    steps: &[Step],
    backend: &Arc<dyn Backend>,
    ieee_nan: bool,
) -> std::result::Result<(), TestCaseError> {
    let (a, b) = (seeded(dims_a, seed, 1), seeded(dims_b, seed, 7));
    let f = |(a, b): (&Tensor, &Tensor)| loss_and_gradients(&[a.clone(), b.clone()], steps);
    let want = compile(f).backend(CpuReference).call((&a, &b));
    prop_assume!(want.is_ok(), "the reference does not differentiate this program");
    let want: Vec<Tensor> = want.unwrap();
    let special = want.iter().any(|w| w.to_data().is_ok_and(|d| d.values().iter().any(|v| !v.is_finite())));
    prop_assume!(ieee_nan || !special, "a NaN or Inf result on a backend that does not promise IEEE specials");
    // Kernels keep f16 intermediates in f32 (as fused PyTorch kernels do), where the reference rounds each
    // to f16: a backward through an f16 `exp` that overflows there (inf · 0) is NaN only in the reference.
    prop_assume!(!(special && steps.iter().any(|s| s.op == 33)), "an f16 overflow the kernels do not round to");
    let (got, ex) = compile(f).backend(backend.clone()).call_explained((&a, &b)).unwrap();
    let got: Vec<Tensor> = got;
    // Gradients compound each op's rounding once more than values do (and f16 steps more so).
    let tol = if steps.iter().any(|s| s.op == 33) { 3e-2 } else { 1e-3 };
    for (g, w) in got.iter().zip(&want) {
        let (g, w) = (g.to_data().unwrap(), w.to_data().unwrap());
        prop_assert_eq!(g.dims(), w.dims());
        prop_assert!(
            close(g.values(), w.values(), tol),
            "kernels {:?}\nreference {:?}\n{}",
            g.values(),
            w.values(),
            ex
        );
    }
    Ok(())
}

/// Seeded input values in [-2, 2], multiples of 1/1000.
fn seeded(dims: &[usize], seed: u32, salt: u32) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f32> =
        (0..n).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed ^ salt) % 4001) as f32 / 1000.0 - 2.0).collect();
    Tensor::from_slice(&v, dims).unwrap()
}

/// One step of a random program: an op code and operand picks (indices into the pool, taken modulo).
#[derive(Clone, Debug)]
pub struct Step {
    /// Op code.
    pub op: u8,
    /// First operand pick.
    pub a: usize,
    /// Second operand pick.
    pub b: usize,
    /// Axis and flag picks.
    pub k: usize,
}

/// A random step.
pub fn step() -> impl Strategy<Value = Step> {
    (0u8..40, any::<usize>(), any::<usize>(), any::<usize>()).prop_map(|(op, a, b, k)| Step { op, a, b, k })
}

/// Random dims: rank 1..=3, each 1..=5.
pub fn dims() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..=5, 1..=3)
}

/// Applies one step; `None` when the op does not apply to these operands: a shape or dtype error, the
/// typed errors a random program legitimately meets. Any other error fails the test.
fn apply(pool: &[Tensor], s: &Step) -> Option<Tensor> {
    // Discontinuous ops (floor, argmax, float-to-int casts) read only the inputs: on computed values an
    // ulp of legitimate difference could flip their result.
    let discontinuous = matches!(s.op, 13 | 24 | 34);
    let x = &pool[s.a % if discontinuous { 2 } else { pool.len() }];
    let y = &pool[s.b % pool.len()];
    let r = x.rank().max(1) as isize;
    let ax = (s.k as isize % r) - if s.k % 2 == 0 { 0 } else { r };
    let res: Result<Tensor> = match s.op {
        0 => x.add(y),
        1 => x.sub(y),
        2 => x.mul(y),
        3 => x.maximum(y),
        4 => x.minimum(y),
        5 => x.div(&y.abs().ok()?.add(1.0).ok()?),
        6 => x.tanh(),
        7 => x.sigmoid(),
        8 => x.erf(),
        9 => x.relu(),
        10 => x.neg(),
        // sqrt away from 0, as division above: at 0 its slope is unbounded, so a last-bit difference
        // a backend may legitimately make (NVIDIA's Vulkan compiler contracts `a * a - m` into one
        // fma: a layer norm of equal values came out 1e-8 instead of 0) grew past any tolerance (a
        // random graph on the H200, session 33). `every_op` and the edge cases keep sqrt at 0.
        11 => x.abs().and_then(|t| t.add(0.25)).and_then(|t| t.sqrt()),
        12 => x.sin(),
        13 => x.floor(),
        14 => x.gelu(),
        15 => x.silu(),
        16 => x.gt(y).and_then(|c| c.where_(x, y)),
        17 => x.sum(&[ax], s.k % 3 == 0),
        18 => x.max(&[ax], s.k % 3 == 1),
        19 => x.mean(&[ax], s.k % 3 == 2),
        20 => x.softmax(ax),
        21 => x.log_softmax(ax),
        22 => x.layer_norm(1, None, None, 1e-5),
        23 => x.var(&[ax], s.k % 2, true),
        24 => x.argmax(ax, s.k % 2 == 0).and_then(|i| i.cast(DType::F32)),
        25 => x.transpose(0, -1),
        26 => {
            let dims: Vec<isize> = x.shape().as_concrete()?.iter().rev().map(|&d| d as isize).collect();
            x.reshape(&[-1]).and_then(|t| t.reshape(&dims))
        }
        27 => x.slice(ax, (s.b % 3) as isize - 1, None, 1 + s.k % 2),
        28 => x.pad(&[(s.b % 2, s.k % 3)], -0.5),
        29 => Tensor::concat(&[x, x], ax),
        30 => {
            let d: Vec<isize> =
                std::iter::once(2).chain(x.shape().as_concrete()?.iter().map(|&v| v as isize)).collect();
            x.unsqueeze(0).and_then(|t| t.expand(&d))
        }
        31 => {
            let last = *x.shape().as_concrete()?.last()?;
            let w = Tensor::full(0.25, &[3, last], DType::F32)
                .ok()?
                .add(&Tensor::arange(0.0, 3.0, 1.0, DType::F32).ok()?.unsqueeze(1).ok()?)
                .ok()?;
            x.linear(&w, None)
        }
        32 => x.matmul(&x.transpose(-1, -2).ok()?),
        33 => x.cast(DType::F16).and_then(|t| t.exp()).and_then(|t| t.cast(DType::F32)),
        34 => x.cast(DType::I32).and_then(|t| t.mul(3i32)).and_then(|t| t.cast(DType::F32)),
        35 => x.causal_mask().and_then(|t| t.softmax(-1)),
        36 => {
            let n = *x.shape().as_concrete()?.first()? as i64;
            // Now and then one index out of range: the reference's error must be every backend's.
            let bad = match s.k % 7 {
                3 => Some(n),
                5 => Some(-1),
                _ => None,
            };
            let idx: Vec<i64> = (0..n).rev().chain(0..1).chain(bad).collect();
            x.index_select(0, &Tensor::from_slice(&idx, &[idx.len()]).ok()?)
        }
        37 => x.min(&[], false),
        38 => x.exp().and_then(|e| e.sum(&[-1], true)).and_then(|s| x.div(&s)),
        _ => x.mul(0.5).and_then(|h| h.add(&x.pow(2.0)?)),
    };
    match res {
        // Small results only (a symbolic one is as small as its concrete twin: the sizes are the same).
        Ok(t) => Some(t).filter(|t| t.shape().as_concrete().is_none_or(|d| d.iter().product::<usize>() <= 4096)),
        Err(
            kiln::Error::Broadcast { .. }
            | kiln::Error::Shape { .. }
            | kiln::Error::Reshape { .. }
            | kiln::Error::Axis { .. }
            | kiln::Error::InvalidArgument { .. }
            | kiln::Error::DType { .. },
        ) => None,
        // What a symbolic trace cannot do yet (slicing a symbolic axis): the program differs from the
        // concrete one there, and the caller does not compare it.
        Err(kiln::Error::Unsupported { .. })
            if x.shape().as_concrete().is_none() || y.shape().as_concrete().is_none() =>
        {
            None
        }
        Err(e) => panic!("step {s:?} failed with an unexpected error: {e}"),
    }
}

thread_local! {
    /// Which steps of the latest [`program`] traced on this thread applied: a symbolic trace can refuse a
    /// step the concrete one took (one that reads a concrete size), and then the programs differ.
    static APPLIED: std::cell::RefCell<Vec<bool>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn program(inputs: &[Tensor], steps: &[Step]) -> Result<Vec<Tensor>> {
    let mut pool: Vec<Tensor> = inputs.to_vec();
    let mut applied = Vec::with_capacity(steps.len());
    for s in steps {
        let t = apply(&pool, s);
        applied.push(t.is_some());
        pool.extend(t);
    }
    APPLIED.with(|a| *a.borrow_mut() = applied);
    let n = pool.len();
    Ok(vec![pool[n - 1].clone(), pool[n / 2].clone()])
}

/// Kernels keep f16 intermediates in f32 (as fused PyTorch kernels do) where the reference rounds each
/// node, so programs that pass through f16 get the half-precision tolerance.
fn close(got: &[f64], want: &[f64], tol: f64) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs().min(1e6)))
}

/// Runs the random program on `backend` and on the CPU reference and compares.
/// `ieee_nan`: the backend promises IEEE NaN and Inf through plain arithmetic; where it does not (WGSL lets
/// drivers assume they never occur), programs whose reference result holds one are not compared.
pub fn check(
    dims_a: &[usize],
    dims_b: &[usize],
    seed: u32,
    steps: &[Step],
    backend: &Arc<dyn Backend>,
    ieee_nan: bool,
) -> std::result::Result<(), TestCaseError> {
    let (a, b) = (seeded(dims_a, seed, 1), seeded(dims_b, seed, 7));
    let reference = compile(|(a, b): (&Tensor, &Tensor)| program(&[a.clone(), b.clone()], steps)).backend(CpuReference);
    // A quarter of the programs run with every dim of size 2 or more symbolic on the backend (one kernel
    // for every size), against the reference's concrete trace (not seed 0: the saved regressions' seed).
    let dynamic = if seed % 4 == 1 { Dynamic::Always } else { Dynamic::Auto };
    let kernels = compile(|(a, b): (&Tensor, &Tensor)| program(&[a.clone(), b.clone()], steps))
        .backend(backend.clone())
        .dynamic(dynamic);
    // A program the reference rejects (an out-of-range gather index) must fail through the kernels too.
    let want = reference.call((&a, &b));
    let concrete = APPLIED.with(|a| a.borrow().clone());
    let same_program = || APPLIED.with(|a| *a.borrow() == concrete);
    let want = match want {
        Ok(w) => w,
        Err(e) => {
            // Device backends report a failed run-time check when a result depending on it is read.
            let got =
                kernels.call((&a, &b)).and_then(|v: Vec<Tensor>| v.iter().try_for_each(|t| t.to_data().map(|_| ())));
            prop_assume!(same_program(), "the symbolic trace took other steps");
            let same = got.as_ref().err().is_some_and(|g| std::mem::discriminant(g) == std::mem::discriminant(&e));
            // A fused kernel checks an index where an element uses it; a strided slice downstream may leave
            // the element with the bad index unread, which the node-by-node reference still computes.
            let unread = got.is_ok() && matches!(e, kiln::Error::Runtime { .. }) && steps.iter().any(|s| s.op == 27);
            prop_assert!(same || unread, "reference failed with {}, kernels gave {:?}", e, got);
            return Ok(());
        }
    };
    let special = want.iter().any(|w| w.to_data().is_ok_and(|d| d.values().iter().any(|v| !v.is_finite())));
    prop_assume!(ieee_nan || !special, "a NaN or Inf result on a backend that does not promise IEEE specials");
    let (got, ex) = kernels.call_explained((&a, &b)).unwrap();
    prop_assume!(same_program(), "the symbolic trace took other steps");
    for (g, w) in got.iter().zip(&want) {
        let (g, w) = (g.to_data().unwrap(), w.to_data().unwrap());
        prop_assert_eq!(g.dims(), w.dims());
        // Through f16 the per-op 1e-2 compounds: a value rounded to f16 (its last bit differing between
        // a fused kernel and the node-by-node reference) feeds `exp`, which multiplies the error by the
        // argument (seen: exp of ~6.2 differing by 1.03%).
        let tol = if steps.iter().any(|s| s.op == 33) { 3e-2 } else { 2e-4 };
        if !close(g.values(), w.values(), tol) {
            let small = minimized(&a, &b, steps, backend);
            prop_assert!(false, "kernels {:?}\nreference {:?}\n{}\n{small}", g.values(), w.values(), ex);
        }
    }
    Ok(())
}

/// A failing random program shrunk by `kiln check`'s minimizer and saved (JSON and a Rust test under
/// `target/kiln-minimized/`), for the failure message: what a person debugging it starts from.
fn minimized(a: &Tensor, b: &Tensor, steps: &[Step], backend: &Arc<dyn Backend>) -> String {
    let specs: Vec<kiln::graph::TensorSpec> = [a, b]
        .iter()
        .map(|t| kiln::graph::TensorSpec::new(t.dtype(), &t.shape().as_concrete().unwrap_or_default()))
        .collect();
    let Ok(graph) = kiln::graph::capture(&specs, |t| program(t, steps)) else {
        return "(the program could not be captured as one graph to minimize)".into();
    };
    let (Ok(x), Ok(y)) = (a.to_data(), b.to_data()) else { return String::new() };
    let case = kiln::graph::minimize::Case { graph, inputs: vec![(*x).clone(), (*y).clone()] };
    let small = kiln::check::minimize(case, std::slice::from_ref(backend), 500);
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-minimized");
    let name = format!("case_{}", std::process::id());
    let what = format!("a random program on {}", backend.name());
    match kiln::graph::minimize::write_reproducer(&small, &what, &dir, &name) {
        Ok((json, _)) => format!("minimized to {} op(s) ({}):\n{}", small.ops(), json.display(), small.graph),
        Err(e) => format!("minimized to {} op(s) (not saved: {e}):\n{}", small.ops(), small.graph),
    }
}

/// Cases proptest once found, replayed on every backend.
pub fn regressions(backend: &Arc<dyn Backend>) {
    let st = |op, a, b, k| Step { op, a, b, k };
    let cases = [
        (
            vec![1],
            vec![1],
            vec![
                st(20, 0, 0, 0),
                st(27, 8525969644211925998, 716660461467300, 0),
                st(0, 0, 0, 0),
                st(0, 0, 6911819692096966318, 1),
            ],
        ),
        // A variance over an axis of an empty slice: kernels with nothing to do.
        (
            vec![1],
            vec![2, 1],
            vec![
                st(27, 3002045085936529397, 12352566093855624494, 587321391003074843),
                st(0, 0, 0, 0),
                st(0, 0, 0, 0),
                st(23, 12115636676276389337, 0, 4366960000172249174),
            ],
        ),
    ];
    // Seeds proptest once saved for the graph crate's differential test (a file nothing replayed).
    let saved = vec![
        (vec![1], vec![1], vec![st(0, 0, 0, 0), st(17, 0, 0, 484238150448945751), st(36, 3246679344907604391, 0, 0)]),
        (vec![2, 1], vec![1], vec![st(0, 0, 0, 0), st(18, 319779058023943604, 0, 17953706451734155318)]),
        (vec![2, 1], vec![1], vec![st(23, 528723239905322156, 0, 533953807793209116), st(0, 0, 0, 0)]),
    ];
    let cases: Vec<_> = cases.into_iter().chain(saved).collect();
    // An out-of-range index under a sum, then a strided slice that leaves the bad element unread.
    let unread = vec![(
        vec![2, 1, 1],
        vec![1],
        vec![
            st(0, 0, 0, 0),
            st(36, 5877281917996878725, 0, 1406042538501832425),
            st(17, 2396137047427136, 0, 0),
            st(0, 0, 2636691994025996154, 0),
            st(0, 1568318737458180118, 0, 0),
            st(27, 11610251943688524486, 3192140028282645883, 11318405270813423839),
        ],
    )];
    let cases: Vec<_> = cases.into_iter().chain(unread).collect();
    // A gather inside a persistent row kernel (its index is bound inside the pass): index_select, then min.
    let gather_in_row = vec![(vec![20, 5], vec![2], vec![st(36, 0, 0, 0), st(37, 2, 0, 0)])];
    let cases: Vec<_> = cases.into_iter().chain(gather_in_row).collect();
    for (da, db, steps) in cases {
        check(&da, &db, 0, &steps, backend, true).unwrap();
    }
    // Differentiated programs random_gradients found failing.
    let gradients = [
        // A variance's and a sum's backward fused into regions that depended on each other in a cycle.
        (
            vec![2],
            vec![1],
            vec![st(0, 0, 0, 0), st(23, 2, 0, 0), st(20, 3, 0, 0), st(0, 0, 0, 0), st(0, 0, 0, 0), st(17, 5, 0, 0)],
        ),
    ];
    for (da, db, steps) in gradients {
        check_gradients(&da, &db, 0, &steps, backend, true).unwrap();
    }
}
