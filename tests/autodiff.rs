//! Gradient checks: every rule of `graph::autodiff` against central finite differences of the forward
//! graph on the CPU reference, on seeded random inputs (moved away from kinks where the op has one),
//! with broadcasting, reductions over chosen axes, batched matmul and the composites (softmax, layer
//! norm, GELU, linear) that differentiate through their decompositions. The joint graph also compiles
//! and runs on the kernel interpreter (fused kernels) with the same gradients.

use kiln::graph::autodiff::grad_graph;
use kiln::graph::workloads::data;
use kiln::graph::{capture, interp, DType, Graph, KernelInterpreter, Tensor, TensorData, TensorSpec};
use std::sync::Arc;

type F = fn(&[Tensor]) -> kiln::Result<Vec<Tensor>>;

fn spec(d: &[usize]) -> TensorSpec {
    TensorSpec::new(DType::F32, d)
}

/// Seeded inputs with `adjust` applied to every value.
fn inputs(specs: &[TensorSpec], adjust: fn(f64) -> f64) -> Vec<TensorData> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let d = data(s, i + 3);
            let v: Vec<f64> = d.values().iter().map(|&x| adjust(x)).collect();
            TensorData::from_f64(v, d.dims(), DType::F32).expect("sizes match")
        })
        .collect()
}

fn loss(g: &Graph, xs: &[TensorData]) -> f64 {
    let refs: Vec<&TensorData> = xs.iter().collect();
    interp::run(g, &refs).expect("forward runs")[0].values()[0]
}

/// Analytic gradients of `f` (which returns one scalar) against central differences, for inputs `wrt`.
fn check(name: &str, specs: &[TensorSpec], f: F, wrt: &[usize], adjust: fn(f64) -> f64) {
    let g = capture(specs, f).expect("captures");
    let joint = grad_graph(&g, wrt).unwrap_or_else(|e| panic!("{name}: {e}"));
    let xs = inputs(specs, adjust);
    let refs: Vec<&TensorData> = xs.iter().collect();
    let out = interp::run(&joint, &refs).expect("the joint graph runs");
    assert!((out[0].values()[0] - loss(&g, &xs)).abs() <= 1e-5 * (1.0 + loss(&g, &xs).abs()), "{name}: value");
    // The joint graph compiles to kernels like any graph and gives the same gradients.
    let rt = KernelInterpreter::default().runtime();
    let compiled = Arc::new(kiln::graph::compile_graph(&joint, rt.target()).expect("compiles"));
    let kernels = rt.run_host(&compiled, &refs).expect("runs on the kernel interpreter");
    // Small enough that a tie's kink (|x − z| at x = z) costs O(h) less than the tolerance, large enough
    // that the reference's f32 rounding of the loss stays below it.
    let h = 2e-3;
    for (k, &w) in wrt.iter().enumerate() {
        let analytic = out[k + 1].values();
        let fused = kernels[k + 1].values();
        assert_eq!(out[k + 1].dims(), xs[w].dims(), "{name}: gradient {k} has its input's shape");
        let n = analytic.len();
        // Up to 24 elements per input, spread over it.
        for e in (0..n).step_by((n / 24).max(1)) {
            let at = |delta: f64| {
                let mut ys = xs.clone();
                let mut v = ys[w].values().to_vec();
                v[e] += delta;
                ys[w] = TensorData::from_f64(v, xs[w].dims(), DType::F32).expect("sizes match");
                loss(&g, &ys)
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            let tol = 3e-3 * (1.0 + fd.abs());
            assert!(
                (analytic[e] - fd).abs() <= tol,
                "{name}: d/d input {w}[{e}]: analytic {} vs finite difference {fd}",
                analytic[e]
            );
            assert!(
                (fused[e] - analytic[e]).abs() <= 1e-4 * (1.0 + fd.abs()),
                "{name}: kernels {} vs reference {}",
                fused[e],
                analytic[e]
            );
        }
    }
}

fn same(x: f64) -> f64 {
    x
}

/// Away from zero (kinks of relu and abs, poles of reciprocal).
fn off_zero(x: f64) -> f64 {
    x + 0.2 * x.signum()
}

/// On a grid of quarters, off zero: two inputs either differ by a quarter or more (no kink within the
/// finite-difference step) or are equal — a tie, where the central difference of `maximum` is one half
/// to each operand, as the rule gives.
fn quarters(x: f64) -> f64 {
    (x * 4.0).round() / 4.0 + 0.05
}

/// Positive (log, sqrt, rsqrt, pow's base).
fn positive(x: f64) -> f64 {
    x.abs() + 0.5
}

fn total(t: Tensor) -> kiln::Result<Vec<Tensor>> {
    let axes: Vec<isize> = (0..t.shape().rank() as isize).collect();
    Ok(vec![t.sum(&axes, false)?])
}

#[test]
fn smooth_unary_ops() {
    check(
        "exp sin cos tanh sigmoid erf neg",
        &[spec(&[3, 4]), spec(&[3, 4])],
        |t| {
            let x = &t[0];
            let y = x.exp()?.add(&x.sin()?.mul(&x.cos()?)?)?.add(&x.tanh()?)?.add(&x.sigmoid()?)?;
            total(y.add(&x.erf()?)?.neg()?.mul(&t[1])?)
        },
        &[0, 1],
        same,
    );
}

#[test]
fn ops_on_positive_inputs() {
    check(
        "log sqrt rsqrt reciprocal pow",
        &[spec(&[5]), spec(&[5])],
        |t| {
            let x = &t[0];
            let y = x.log()?.add(&x.sqrt()?)?.add(&x.rsqrt()?)?.add(&x.reciprocal()?)?;
            total(y.add(&x.pow(&t[1])?)?)
        },
        &[0, 1],
        positive,
    );
}

#[test]
fn kinked_ops_away_from_their_kinks() {
    check(
        "relu abs maximum minimum where",
        &[spec(&[4, 3]), spec(&[4, 3])],
        |t| {
            let (x, z) = (&t[0], &t[1]);
            let y = x.relu()?.add(&x.abs()?)?.add(&x.maximum(z)?)?.sub(&x.minimum(z)?)?;
            let w = x.gt(0.0)?.where_(&x.mul(2.0)?, &x.mul(x)?)?;
            total(y.add(&w)?.mul(z)?)
        },
        &[0, 1],
        quarters,
    );
}

#[test]
fn broadcasting_and_scalars() {
    check(
        "x * 1.5 + bias[4] - x / row[3,1]",
        &[spec(&[3, 4]), spec(&[4]), spec(&[3, 1])],
        |t| total(t[0].mul(1.5)?.add(&t[1])?.sub(&t[0].div(&t[2])?)?.mul(&t[0])?),
        &[0, 1, 2],
        off_zero,
    );
}

#[test]
fn reductions_over_chosen_axes() {
    check(
        "max over axis 1, sum keepdim over 0, mean",
        &[spec(&[3, 5, 2])],
        |t| {
            let x = &t[0];
            let m = x.max(&[1], false)?.mul(&x.max(&[1], false)?)?;
            let s = x.sum(&[0], true)?.mul(x)?.mean(&[0, 1, 2], false)?;
            Ok(vec![m.sum(&[0, 1], false)?.add(&s)?])
        },
        &[0],
        same,
    );
}

#[test]
fn batched_matmul_and_a_broadcast_weight() {
    check(
        "[2,3,4] @ [4,5]",
        &[spec(&[2, 3, 4]), spec(&[4, 5]), spec(&[2, 3, 5])],
        |t| total(t[0].matmul(&t[1])?.mul(&t[2])?),
        &[0, 1],
        same,
    );
}

#[test]
fn composites_through_their_decompositions() {
    check(
        "softmax(gelu(layer_norm(linear(x))))",
        &[spec(&[3, 6]), spec(&[4, 6]), spec(&[4]), spec(&[4]), spec(&[4]), spec(&[3, 4])],
        |t| {
            let h = t[0].linear(&t[1], Some(&t[2]))?.layer_norm(1, Some(&t[3]), Some(&t[4]), 1e-5)?;
            total(h.gelu()?.softmax(-1)?.mul(&t[5])?)
        },
        &[0, 1, 2, 3, 4],
        same,
    );
}

#[test]
fn ops_without_a_rule_say_so() {
    let g = capture(&[spec(&[6])], |t| total(t[0].narrow(0, 1, 3)?)).expect("captures");
    let e = grad_graph(&g, &[0]).expect_err("no rule for slices yet");
    assert!(matches!(e, kiln::Error::Unsupported { .. }) && e.to_string().contains("no rule yet"), "{e}");
    let g = capture(&[spec(&[6])], |t| Ok(vec![t[0].exp()?])).expect("captures");
    assert!(matches!(grad_graph(&g, &[0]), Err(kiln::Error::Unsupported { .. })), "a non-scalar output");
}
