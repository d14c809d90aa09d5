//! Split reductions (`split_reduce`): the kernels a too-long reduction becomes, and that they compute
//! what one pass would (through the kernel interpreter, against the reference).

use kiln_graph::kernel::{Kernel, LoopMode, ReduceStrategy, Stmt};
use kiln_graph::workloads::{data, f32s, with_dtype};
use kiln_graph::{capture, compile_graph, interp, CompiledGraph, DType, Result, Target, Tensor, TensorSpec};

/// Compiles `f` for CUDA and checks it through the kernel interpreter against the reference.
fn checked(specs: &[TensorSpec], f: fn(&[Tensor]) -> Result<Vec<Tensor>>, rtol: f64) -> CompiledGraph {
    let g = capture(specs, f).unwrap();
    let c = compile_graph(&g, &Target::cuda(90)).unwrap();
    let inputs: Vec<_> = specs.iter().enumerate().map(|(i, s)| data(s, i)).collect();
    let refs: Vec<_> = inputs.iter().collect();
    let got = c.run_interpreted(&refs).unwrap();
    let want = interp::run(&g, &refs).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.dims(), w.dims());
        let scale = w.values().iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for (a, b) in g.values().iter().zip(w.values()) {
            assert!((a - b).abs() <= rtol * scale, "{a} vs {b}\n{c}");
        }
    }
    c
}

/// The reduction strategies of a kernel's reductions, and whether its outer loop is per thread.
fn strategies(k: &Kernel) -> (Vec<ReduceStrategy>, bool) {
    fn visit(body: &[Stmt], out: &mut Vec<ReduceStrategy>) {
        for s in body {
            match s {
                Stmt::Reduce { strategy, body, .. } => {
                    out.push(*strategy);
                    visit(body, out);
                }
                Stmt::Loop { body, .. } => visit(body, out),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    visit(&k.body, &mut out);
    let per_thread = k.body.iter().any(|s| matches!(s, Stmt::Loop { mode: LoopMode::Global, .. }));
    (out, per_thread)
}

fn mean_all(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].mean(&[0, 1, 2], false)?])
}

/// A mean over a whole batch is one row: one workgroup on a GPU of a hundred cores. It runs as 32
/// rows of 4,096, then one row of the 32 partials.
#[test]
fn a_mean_over_everything_runs_on_many_rows_then_one() {
    let c = checked(&[f32s(&[1, 64, 2048])], mean_all, 1e-5);
    assert_eq!(c.kernels.len(), 2, "{c}");
    assert_eq!(c.kernels[0].launch.groups.as_const(), Some(32), "{}", c.kernels[0]);
    assert_eq!(c.kernels[1].launch.groups.as_const(), Some(1), "{}", c.kernels[1]);
}

fn column_sum(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].sum(&[0, 1], false)?])
}

/// A bias gradient (a sum over the tokens of each feature) reads its columns side by side, a thread
/// per column piece: 32 pieces of 16 tokens, then the 32 partials, both passes one thread per output.
/// A bf16 input keeps its partials in f32 and rounds once.
#[test]
fn a_bias_gradient_sums_columns_side_by_side_in_two_passes() {
    for dtype in [DType::F32, DType::BF16] {
        let c = checked(&with_dtype(vec![f32s(&[2, 256, 768])], dtype), column_sum, 2e-2);
        assert_eq!(c.kernels.len(), 2, "{c}");
        for k in &c.kernels {
            assert_eq!(strategies(k), (vec![ReduceStrategy::Serial], true), "{k}");
        }
        let partial = &c.kernels[0].buffers.last().unwrap();
        assert_eq!(partial.dtype, DType::F32, "{}", c.kernels[0]);
        assert_eq!(c.kernels[1].buffers.last().unwrap().dtype, dtype, "{}", c.kernels[1]);
    }
}

fn odd_column_sum(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].sum(&[0], false)?])
}

/// A column whose length has no divisor to cut it at (4,099 is prime) stays one pass, a workgroup per
/// column as before, and still computes the sum.
#[test]
fn a_column_without_divisors_stays_one_pass() {
    let c = checked(&[f32s(&[4099, 64])], odd_column_sum, 1e-5);
    assert_eq!(c.kernels.len(), 1, "{c}");
    assert!(matches!(strategies(&c.kernels[0]).0[..], [ReduceStrategy::Group { .. }]), "{}", c.kernels[0]);
}

fn long_column_sum(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].sum(&[0], false)?])
}

/// With subgroups (CUDA), a bias gradient over 4,096 tokens is two passes: 256 serial pieces of 16
/// tokens, then a subgroup per feature over its 256 partials, eight features to a workgroup. Without
/// them (WebGPU) the partials are summed serially, which needs a middle pass to keep each short.
#[test]
fn a_long_column_ends_with_a_subgroup_per_column_where_the_target_has_subgroups() {
    let c = checked(&[f32s(&[4096, 768])], long_column_sum, 1e-5);
    assert_eq!(c.kernels.len(), 2, "{c}");
    assert_eq!(strategies(&c.kernels[0]), (vec![ReduceStrategy::Serial], true), "{}", c.kernels[0]);
    let last = &c.kernels[1];
    assert!(matches!(strategies(last).0[..], [ReduceStrategy::Group { .. }]), "{last}");
    assert_eq!((last.launch.threads, last.launch.packed), (32, 8), "{last}");
    let g = capture(&[f32s(&[4096, 768])], long_column_sum).unwrap();
    let web = compile_graph(&g, &Target::webgpu_default()).unwrap();
    assert_eq!(web.kernels.len(), 3, "{web}");
    assert!(web.kernels.iter().all(|k| k.launch.packed == 1), "{web}");
}

fn short_rows(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].sum(&[1], false)?])
}

fn short_row_argmax(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![t[0].argmax(1, false)?])
}

/// Rows of 64 take a subgroup each, eight to a workgroup, where the target has subgroups and every
/// combine is a subgroup one; an arg reduction combines pairs through shared memory, so it is not packed.
#[test]
fn short_rows_share_a_workgroup_a_subgroup_each() {
    let c = checked(&[f32s(&[300, 64])], short_rows, 1e-5);
    assert_eq!(c.kernels.len(), 1, "{c}");
    let k = &c.kernels[0];
    assert_eq!((k.launch.threads, k.launch.packed, k.launch.device_threads()), (32, 8, 256), "{k}");
    assert_eq!(k.launch.device_groups(300), 38);
    let c = checked(&[f32s(&[300, 64])], short_row_argmax, 0.0);
    assert_eq!(c.kernels[0].launch.packed, 1, "{}", c.kernels[0]);
    let g = capture(&[f32s(&[300, 64])], short_rows).unwrap();
    let web = compile_graph(&g, &Target::webgpu_default()).unwrap();
    assert_eq!(web.kernels[0].launch.packed, 1, "{web}");
}
