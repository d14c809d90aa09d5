//! All-reduces in a compiled graph: bucketed by when the schedule makes their inputs, each bucket
//! launched right after its last input (so it runs beside the kernels after it), its inputs kept
//! allocated until the first reader of its results waits for it; compiled away where a process is a
//! world of one (no collectives on the target); the kernel interpreter runs the CUDA target's buckets
//! as that world of one.

use kiln_graph::bucket::BUCKET_BYTES;
use kiln_graph::ir::CollectiveOp;
use kiln_graph::kernel::Access;
use kiln_graph::{
    capture, compile_graph, compile_graph_with, CompiledGraph, FusionMode, KernelInterpreter, Result, Target, Tensor,
    TensorData,
};
use std::sync::Arc;

use kiln_graph::workloads::f32s;

/// Width of the layers: each activation is `WIDTH²` f32s (4 MiB).
const WIDTH: usize = 1024;
/// Layers: their activations (48 MiB) fill two 25 MiB buckets (six 4 MiB tensors each).
const LAYERS: usize = 12;

/// A chain of matmuls (one kernel each, in order), every activation all-reduced and read back by a
/// kernel of its own (as an optimizer's update reads each averaged gradient).
fn chain(t: &[Tensor]) -> Result<Vec<Tensor>> {
    let (mut h, w) = (t[0].clone(), &t[1]);
    let mut out = Vec::new();
    for _ in 0..LAYERS {
        h = h.matmul(w)?;
        out.push(h.all_reduce(CollectiveOp::Mean)?.sum(&[1], false)?);
    }
    out.push(h);
    Ok(out)
}

fn compiled(target: &Target, mode: FusionMode) -> CompiledGraph {
    let g = capture(&[f32s(&[WIDTH, WIDTH]), f32s(&[WIDTH, WIDTH])], chain).expect("traces");
    compile_graph_with(&g, target, mode).expect("compiles")
}

fn buckets(c: &CompiledGraph) -> Vec<usize> {
    c.plan.launches.iter().copied().filter(|&k| c.kernels[k].all_reduce().is_some()).collect()
}

#[test]
fn all_reduces_are_bucketed_in_the_order_the_schedule_makes_their_inputs() {
    let c = compiled(&Target::cuda(90), FusionMode::Fused);
    let at = buckets(&c);
    let per_bucket = (BUCKET_BYTES / (WIDTH * WIDTH * 4) as u64) as usize;
    assert_eq!(at.len(), LAYERS.div_ceil(per_bucket), "{c}");
    let parts: Vec<usize> = at.iter().map(|&k| c.kernels[k].all_reduce().unwrap().parts.len()).collect();
    assert_eq!(parts, vec![per_bucket, LAYERS - per_bucket], "{c}");
    // Each bucket comes right after the kernel making its last input: the next layers' matmuls (and
    // the next bucket) run while it does.
    for &k in &at {
        let reads: Vec<_> = c.kernels[k].buffers.iter().filter(|b| b.access == Access::Read).map(|b| b.node).collect();
        let last_maker = (0..k)
            .rev()
            .find(|&j| c.kernels[j].buffers.iter().any(|b| b.access == Access::Write && reads.contains(&b.node)))
            .expect("a kernel makes the bucket's inputs");
        assert_eq!(last_maker + 1, k, "bucket {} launches right after its last input's kernel: {c}", c.kernels[k].name);
    }
    assert!(at[0] < LAYERS, "the first bucket goes out before the last layers' matmuls: {c}");
    // What reads a bucket's results waits for it: it comes after every kernel that does not, so the
    // device waits once the rest of the work is queued.
    let first_wait = *c.plan.waits.first().expect("the results are read");
    let last_matmul = (0..c.kernels.len()).filter(|&k| c.kernels[k].name.contains("matmul")).max().unwrap();
    assert!(first_wait > last_matmul, "the first wait ({first_wait}) comes after the last matmul ({last_matmul}): {c}");
}

#[test]
fn the_first_reader_of_a_bucket_waits_for_it_and_its_inputs_live_until_then() {
    let c = compiled(&Target::cuda(90), FusionMode::Fused);
    for k in buckets(&c) {
        let kernel = &c.kernels[k];
        let results: Vec<_> = kernel.buffers.iter().filter(|b| b.access == Access::Write).map(|b| b.node).collect();
        let reader = (k + 1..c.kernels.len())
            .find(|&j| c.kernels[j].buffers.iter().any(|b| b.access == Access::Read && results.contains(&b.node)))
            .expect("the results are read");
        let wait = *c.plan.waits.range(k + 1..).next().expect("a wait after the bucket");
        assert!(wait <= reader, "the device waits for {} by its first reader ({wait} > {reader})", kernel.name);
        assert!(c.plan.waits.contains(&reader) || wait < reader, "{:?}", c.plan.waits);
        for b in kernel.buffers.iter().filter(|b| b.access == Access::Read) {
            let buffer = c.plan.value_buffer[&b.node];
            assert!(
                c.plan.live[buffer].1 >= wait,
                "{}'s input {} is freed at kernel {} before the wait at {wait}: the next kernel could overwrite it \
                 while the collective reads it",
                kernel.name,
                b.node,
                c.plan.live[buffer].1
            );
        }
    }
}

/// A bucket binds nothing (a collective is handed pointers): one bucket of every tensor compiles past
/// the target's binding limit.
#[test]
fn one_bucket_may_hold_more_tensors_than_a_kernel_binds() {
    let target = Target { bucket_bytes: u64::MAX, max_bindings: 8, ..Target::cuda(90) };
    let c = compiled(&target, FusionMode::Fused);
    assert_eq!(buckets(&c).len(), 1, "{c}");
    assert_eq!(c.kernels[buckets(&c)[0]].buffers.len(), 2 * LAYERS);
}

/// An all-reduce of an all-reduce's result never shares its bucket (one call issues its parts
/// together: the second would read what the first has not written) and runs after it, though its
/// own input is made first.
#[test]
fn an_all_reduce_of_an_all_reduce_goes_in_the_next_bucket() {
    let g = capture(&[f32s(&[64])], |t| {
        let once = t[0].exp()?.all_reduce(CollectiveOp::Sum)?;
        Ok(vec![once.all_reduce(CollectiveOp::Sum)?.add(&once)?])
    })
    .expect("traces");
    let c = compile_graph(&g, &Target::cuda(90)).expect("compiles");
    let at = buckets(&c);
    assert_eq!(at.len(), 2, "{c}");
    let first_writes: Vec<_> =
        c.kernels[at[0]].buffers.iter().filter(|b| b.access == Access::Write).map(|b| b.node).collect();
    assert!(
        c.kernels[at[1]].buffers.iter().any(|b| b.access == Access::Read && first_writes.contains(&b.node)),
        "the second bucket reads the first's result: {c}"
    );
}

#[test]
fn the_eager_baseline_issues_each_all_reduce_alone() {
    let c = compiled(&Target::cuda(90), FusionMode::PerOp);
    assert_eq!(buckets(&c).len(), LAYERS, "{c}");
}

#[test]
fn a_target_without_collectives_compiles_them_away() {
    for target in [Target::webgpu_default(), Target::interpreter()] {
        let c = compiled(&target, FusionMode::Fused);
        assert!(buckets(&c).is_empty(), "{}: {c}", target.name);
    }
}

/// The CUDA target's buckets on the kernel interpreter (one process: a world of one) give what the
/// reference gives: the all-reduce of one rank's value is that value.
#[test]
fn a_world_of_one_reduces_to_the_value_itself() {
    let (n, width) = (3, 8);
    let specs = [f32s(&[width, width]), f32s(&[width, width])];
    let g = capture(&specs, |t| {
        let h = t[0].matmul(&t[1])?;
        let r = h.all_reduce(CollectiveOp::Sum)?;
        let s = t[0].tanh()?.all_reduce(CollectiveOp::Mean)?;
        Ok(vec![r.add(&s)?, h.all_reduce(CollectiveOp::Mean)?.reshape(&[width as isize * width as isize])?])
    })
    .expect("traces");
    let c = Arc::new(compile_graph(&g, &Target::cuda(90)).expect("compiles"));
    assert!(!buckets(&c).is_empty(), "{c}");
    let data: Vec<TensorData> = (0..2)
        .map(|i| {
            let v: Vec<f32> = (0..width * width).map(|j| ((j * (i + n)) % 7) as f32 / 7.0 - 0.4).collect();
            TensorData::new(&v, &[width, width])
        })
        .collect::<Result<_>>()
        .expect("data");
    let inputs: Vec<&TensorData> = data.iter().collect();
    let got = KernelInterpreter::new(Target::cuda(90)).runtime().run_host(&c, &inputs).expect("runs");
    let want = kiln_graph::interp::run(&g, &inputs).expect("reference");
    for (a, b) in got.iter().zip(&want) {
        for (x, y) in a.values().iter().zip(b.values()) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }
}

/// A bf16-mixed step's weight gradient: a bf16 product widened to f32 and averaged across the world.
/// The library call writes the f32 sum itself (no copy kernel widening the bf16 result for the
/// collective to read), and the interpreter runs it as the device does: within bf16's rounding of the
/// reference, which rounds the product first.
#[test]
fn a_widened_product_a_collective_reads_is_written_wide_by_its_gemm() {
    let (m, k, n) = (64, 96, 80);
    let specs = [f32s(&[m, k]), f32s(&[k, n])];
    let g = capture(&specs, |t| {
        let (a, b) = (t[0].cast(kiln_graph::DType::BF16)?, t[1].cast(kiln_graph::DType::BF16)?);
        let grad = a.matmul(&b)?.cast(kiln_graph::DType::F32)?;
        Ok(vec![grad.all_reduce(CollectiveOp::Mean)?.neg()?])
    })
    .expect("traces");
    let target = Target::cuda(90);
    let c = Arc::new(compile_graph(&g, &target).expect("compiles"));
    let gemms: Vec<_> = c.kernels.iter().filter_map(|k| k.gemm()).collect();
    assert_eq!(gemms.len(), 1, "{c}");
    assert!(gemms[0].widened && gemms[0].out_dtype() == kiln_graph::DType::F32, "{c}");
    let copies = c.fusion.regions.iter().filter(|r| r.members.len() == 1 && r.name.ends_with("_cast"));
    let widening: Vec<_> = copies
        .filter(|r| r.members.iter().all(|&x| c.primitive.graph.node(x).dtype == kiln_graph::DType::F32))
        .map(|r| r.name.clone())
        .collect();
    assert!(widening.is_empty(), "no copy widens the product: {widening:?}\n{c}");
    // Without a collective the update reads the bf16 product in place, widening it as it loads.
    let alone = capture(&specs, |t| {
        let (a, b) = (t[0].cast(kiln_graph::DType::BF16)?, t[1].cast(kiln_graph::DType::BF16)?);
        Ok(vec![a.matmul(&b)?.cast(kiln_graph::DType::F32)?.neg()?])
    })
    .expect("traces");
    let plain = compile_graph(&alone, &target).expect("compiles");
    assert!(plain.kernels.iter().filter_map(|k| k.gemm()).all(|g| !g.widened), "{plain}");
    let data: Vec<TensorData> = [(m, k), (k, n)]
        .iter()
        .enumerate()
        .map(|(i, &(r, cols))| {
            let v: Vec<f32> = (0..r * cols).map(|j| ((j * (i + 3)) % 11) as f32 / 44.0 - 0.1).collect();
            TensorData::new(&v, &[r, cols])
        })
        .collect::<Result<_>>()
        .expect("data");
    let inputs: Vec<&TensorData> = data.iter().collect();
    let got = KernelInterpreter::new(target).runtime().run_host(&c, &inputs).expect("runs");
    let want = kiln_graph::interp::run(&g, &inputs).expect("reference");
    let mut unrounded = false;
    for (x, y) in got[0].values().iter().zip(want[0].values()) {
        assert!((x - y).abs() <= 2f64.powi(-8) * y.abs(), "{x} vs {y}");
        unrounded |= x != y;
    }
    assert!(unrounded, "the f32 sums are written as they are, not rounded to bf16 first");
}

#[test]
fn an_all_reduce_of_a_boolean_or_a_mean_of_integers_is_a_dtype_error() {
    let g = capture(&[f32s(&[4])], |t| {
        let b = t[0].gt(0.0)?;
        assert!(b.all_reduce(CollectiveOp::Sum).is_err());
        let i = t[0].cast(kiln_graph::DType::I32)?;
        assert!(i.all_reduce(CollectiveOp::Mean).is_err());
        Ok(vec![i.all_reduce(CollectiveOp::Sum)?])
    });
    g.expect("an integer sum is fine");
}
