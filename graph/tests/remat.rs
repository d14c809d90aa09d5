//! Recomputation in the backward pass (`remat`): a bf16 model's backward computes its wide
//! intermediates again from the narrow values it reads, rather than reading them back from memory.

use kiln_graph::autodiff::grad_graph;
use kiln_graph::workloads::{data, f32s, with_dtype};
use kiln_graph::{capture, compile_graph, interp, DType, Target};

/// `mean(gelu(x) · y)` over bf16 `x`, `y`, differentiated: the GELU computes in f32, and its backward
/// needs `1 + erf(x/√2)` and `x/2`. No kernel writes or reads an f32 tensor the size of `x`: the
/// backward computes them from `x`. The gradient still matches the reference.
#[test]
fn a_bf16_gelu_backward_recomputes_its_f32_intermediates() {
    let specs = with_dtype(vec![f32s(&[64, 256]), f32s(&[64, 256])], DType::BF16);
    let g = capture(&specs, |t| Ok(vec![t[0].gelu()?.mul(&t[1])?.mean(&[0, 1], false)?])).unwrap();
    let joint = grad_graph(&g, &[0]).unwrap();
    let c = compile_graph(&joint, &Target::cuda(90)).unwrap();
    for k in &c.kernels {
        for b in &k.buffers {
            let wide = b.dtype == DType::F32 && b.len.as_const() == Some(64 * 256);
            assert!(!wide, "{:?} f32 buffer in\n{c}", b.access);
        }
    }
    let inputs: Vec<_> = specs.iter().enumerate().map(|(i, s)| data(s, i)).collect();
    let refs: Vec<_> = inputs.iter().collect();
    let (got, want) = (c.run_interpreted(&refs).unwrap(), interp::run(&joint, &refs).unwrap());
    for (g, w) in got.iter().zip(&want) {
        for (a, b) in g.values().iter().zip(w.values()) {
            assert!((a - b).abs() <= 2e-2 * (1e-3 + b.abs()), "{a} vs {b}");
        }
    }
}
