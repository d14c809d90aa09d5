//! Gradient checks: every rule of `graph::autodiff` against central finite differences of the forward
//! graph on the CPU reference, on seeded random inputs (moved away from kinks where the op has one),
//! with broadcasting, reductions over chosen axes, batched matmul and the composites (softmax, layer
//! norm, GELU, linear) that differentiate through their decompositions. The joint graph also compiles
//! to fused kernels and runs on the kernel interpreter and on wgpu (lavapipe in CI; with no adapter the
//! tests fail saying what to install, unless `KILN_WGPU_TESTS=skip`) with the same gradients.

mod common;

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
    let value = loss(&g, &xs);
    assert!((out[0].values()[0] - value).abs() <= 1e-5 * (1.0 + value.abs()), "{name}: value");
    // The joint graph compiles to kernels like any graph and gives the same gradients on every device.
    let on_devices: Vec<(String, Vec<TensorData>)> = common::kernel_devices()
        .iter()
        .map(|rt| {
            let compiled = Arc::new(kiln::graph::compile_graph(&joint, rt.target()).expect("compiles"));
            (
                rt.name().to_string(),
                rt.run_host(&compiled, &refs).unwrap_or_else(|e| panic!("{name} on {}: {e}", rt.name())),
            )
        })
        .collect();
    // Small enough that a tie's kink (|x − z| at x = z) costs O(h) less than the tolerance, large enough
    // that the reference's f32 rounding of the loss stays below it.
    let h = 2e-3;
    for (k, &w) in wrt.iter().enumerate() {
        let analytic = out[k + 1].values();
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
            // The reference rounds the loss to f32: a difference quotient cannot resolve less than a few
            // of its ulps over 2h.
            let noise = 8.0 * value.abs() * f64::from(f32::EPSILON) / (2.0 * h);
            let tol = 3e-3 * (1.0 + fd.abs()) + noise;
            assert!(
                (analytic[e] - fd).abs() <= tol,
                "{name}: d/d input {w}[{e}]: analytic {} vs finite difference {fd}",
                analytic[e]
            );
            for (device, outs) in &on_devices {
                let got = outs[k + 1].values()[e];
                // Device math is f32 throughout (its exp, tanh, erf are not the reference's).
                let ok = (got - analytic[e]).abs() <= 1e-3 * (1.0 + analytic[e].abs());
                assert!(ok, "{name} on {device}: {got} vs reference {}", analytic[e]);
            }
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

/// `softmax(q kᵀ / 2 [causal]) v`, weighted: the attention stays whole in the forward graph and its
/// gradient is flash attention's backward (log-sum-exp, probabilities rebuilt), written out again
/// where the device does not fuse it.
fn weighted_attention(t: &[Tensor], causal: bool) -> kiln::Result<Vec<Tensor>> {
    let s = t[0].matmul(&t[1].transpose(-1, -2)?)?.mul(0.5)?;
    let s = if causal { s.causal_mask()? } else { s };
    total(s.softmax(-1)?.matmul(&t[2])?.mul(&t[3])?)
}

#[test]
fn attention_through_its_backward_ops() {
    let specs = [spec(&[2, 5, 4]), spec(&[2, 6, 4]), spec(&[2, 6, 3]), spec(&[2, 5, 3])];
    let cases: [(&str, F); 2] =
        [("attention", |t| weighted_attention(t, false)), ("causal attention", |t| weighted_attention(t, true))];
    for (name, f) in cases {
        let joint = grad_graph(&capture(&specs, f).expect("captures"), &[0, 1, 2]).expect("differentiates");
        let names: Vec<&str> = joint.nodes.iter().map(|n| n.op.name()).collect();
        for op in ["attention", "attention_lse", "attention_grad_q", "attention_grad_k", "attention_grad_v"] {
            assert!(names.contains(&op), "{name}: the joint graph has no {op}: {names:?}");
        }
        check(name, &specs, f, &[0, 1, 2], same);
    }
}

#[test]
fn convolutions_and_pools_through_their_decompositions() {
    use kiln::graph::Window;
    check(
        "avg_pool(max_pool(conv2d(x, w, b, stride 2, pad 1, groups 2)))",
        &[spec(&[2, 4, 7, 6]), spec(&[6, 2, 3, 3]), spec(&[6]), spec(&[2, 6, 2, 2])],
        |t| {
            let y = t[0].conv(&t[1], Some(&t[2]), &Window::uniform(2, 2, 1, 1), 2)?;
            let y = y.max_pool(&[2, 2], &Window::uniform(2, 1, 0, 1))?;
            let y = y.avg_pool(&[2, 2], &Window::uniform(2, 1, 1, 1), false)?;
            total(y.narrow(2, 0, 2)?.narrow(3, 0, 2)?.mul(&t[3])?)
        },
        &[0, 1, 2],
        same,
    );
}

#[test]
fn slices_concatenation_and_padding() {
    check(
        "x[1:5] * x[::2] ++ pad(x[..., 1::3]) ++ narrow",
        &[spec(&[3, 8]), spec(&[3, 4])],
        |t| {
            let x = &t[0];
            let a = x.slice(1, 1, Some(5), 1)?.mul(&x.slice(1, 0, None, 2)?)?;
            let b = x.slice(1, 1, None, 3)?.pad(&[(0, 0), (1, 0)], 0.0)?;
            let c = Tensor::concat(&[&a, &b, &x.narrow(1, 6, 2)?], 1)?;
            total(c.exp()?.narrow(1, 0, 4)?.mul(&t[1])?)
        },
        &[0, 1],
        same,
    );
}

#[test]
fn index_select_adds_repeated_rows_back() {
    check(
        "index_select with repeats, on axes 0 and 1",
        &[spec(&[4, 3]), spec(&[6, 3])],
        |t| {
            // [0, 0, 1, 1, 2, 2] and [2, 1, 0]: repeats and a reversal.
            let rows = Tensor::arange(0.0, 3.0, 0.5, DType::F32)?.floor()?.cast(DType::I64)?;
            let cols = Tensor::arange(2.0, -1.0, -1.0, DType::F32)?.cast(DType::I64)?;
            let picked = t[0].index_select(0, &rows)?.index_select(1, &cols)?;
            total(picked.mul(&t[1])?.tanh()?)
        },
        &[0, 1],
        same,
    );
}

#[test]
fn gather_adds_back_at_its_indices() {
    check(
        "gather along axis 1 with repeats",
        &[spec(&[3, 4]), spec(&[3, 4])],
        |t| {
            // index[i][j] = floor(j / 2) + i mod-free: [[0,0,1,1],[1,1,2,2],[2,2,3,3]].
            let j = Tensor::arange(0.0, 2.0, 0.5, DType::F32)?.floor()?.reshape(&[1, 4])?;
            let i = Tensor::arange(0.0, 3.0, 1.0, DType::F32)?.reshape(&[3, 1])?;
            let index = j.add(&i)?.cast(DType::I64)?;
            total(t[0].gather(1, &index)?.mul(&t[1])?.sin()?)
        },
        &[0, 1],
        same,
    );
}

#[test]
fn what_a_rule_cannot_do_says_so() {
    let g = capture(&[spec(&[3, 4])], |t| {
        let index = Tensor::arange(0.0, 2.0, 1.0, DType::F32)?.cast(DType::I64)?.reshape(&[2, 1])?;
        total(t[0].gather(0, &index)?)
    })
    .expect("captures");
    let e = grad_graph(&g, &[0]).expect_err("an index smaller than its input");
    assert!(matches!(e, kiln::Error::Unsupported { .. }) && e.to_string().contains("gather"), "{e}");
    let g = capture(&[spec(&[6])], |t| Ok(vec![t[0].exp()?])).expect("captures");
    assert!(matches!(grad_graph(&g, &[0]), Err(kiln::Error::Unsupported { .. })), "a non-scalar output");
}

/// A least-squares loss `mean((x @ w + b − y)²)`: its gradients in closed form.
fn least_squares(t: &[Tensor]) -> kiln::Result<Tensor> {
    let r = t[0].matmul(&t[1])?.add(&t[2])?.sub(&t[3])?;
    r.mul(&r)?.mean(&[0, 1], false)
}

#[test]
fn value_and_grad_on_the_host_and_on_a_device() {
    use kiln::graph::autodiff::value_and_grad;
    let specs = [spec(&[5, 3]), spec(&[3, 2]), spec(&[2]), spec(&[5, 2])];
    let host: Vec<Tensor> = inputs(&specs, same).into_iter().map(Tensor::from_data).collect();
    let (value, grads) = value_and_grad(least_squares, &host, &[1, 2]).expect("differentiates");
    // Closed form: r = xw + b − y; dL/dw = 2/N · xᵀr, dL/db = 2/N · Σ_rows r (N = 10 elements).
    let v = |t: &Tensor| t.to_data().unwrap().values().to_vec();
    let (x, w, b, y) = (v(&host[0]), v(&host[1]), v(&host[2]), v(&host[3]));
    let r: Vec<f64> =
        (0..10).map(|e| (0..3).map(|k| x[e / 2 * 3 + k] * w[k * 2 + e % 2]).sum::<f64>() + b[e % 2] - y[e]).collect();
    let dw: Vec<f64> = (0..6).map(|e| (0..5).map(|i| x[i * 3 + e / 2] * r[i * 2 + e % 2]).sum::<f64>() * 0.2).collect();
    let db: Vec<f64> = (0..2).map(|j| (0..5).map(|i| r[i * 2 + j]).sum::<f64>() * 0.2).collect();
    let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(p, q)| (p - q).abs() <= 1e-5 * (1.0 + q.abs()));
    assert!((v(&value)[0] - r.iter().map(|e| e * e).sum::<f64>() / 10.0).abs() < 1e-5);
    assert!(close(&v(&grads[0]), &dw) && close(&v(&grads[1]), &db), "{:?} {:?}", v(&grads[0]), dw);
    // On a device the joint graph runs there as kernels and the gradients stay there.
    let rt = KernelInterpreter::default().runtime();
    let on: Vec<Tensor> = host.iter().map(|t| t.to(rt.clone()).unwrap()).collect();
    let (_, dev) = value_and_grad(least_squares, &on, &[1, 2]).expect("differentiates on the device");
    assert_eq!(dev[0].device_name(), Some(rt.name()));
    assert!(close(&v(&dev[0]), &dw) && close(&v(&dev[1]), &db));
    // A captured weight is named as the problem.
    let captured = host[1].clone();
    let e = value_and_grad(|t| t[0].matmul(&captured)?.sum(&[0, 1], false), &host[..1], &[0]).expect_err("a weight");
    assert!(e.to_string().contains("pass every tensor it reads as an argument"), "{e}");
}

/// One SGD step on the least-squares loss, returning the loss and the updated weight and bias.
fn sgd_step(t: Vec<Tensor>) -> kiln::Result<Vec<Tensor>> {
    let (loss, g) = kiln::value_and_grad(least_squares, &t, &[1, 2])?;
    Ok(vec![loss, t[1].sub(&g[0].mul(0.1)?)?, t[2].sub(&g[1].mul(0.1)?)?])
}

/// `value_and_grad` inside `compile`: forward, backward and the update are traced as one graph (no
/// break), run as fused kernels, and give what the eager step gives, over five steps that feed each
/// step's weights to the next.
#[test]
fn a_compiled_train_step_is_one_graph_and_matches_the_eager_step() {
    let specs = [spec(&[5, 3]), spec(&[3, 2]), spec(&[2]), spec(&[5, 2])];
    let start: Vec<Tensor> = inputs(&specs, same).into_iter().map(Tensor::from_data).collect();
    let rt = KernelInterpreter::default().runtime();
    let step = kiln::compile(sgd_step).backend(rt.clone());
    let ex = step.explain(start.clone()).expect("traces");
    assert_eq!((ex.graph_count(), ex.breaks.len()), (1, 0), "{ex}");
    let (mut eager, mut compiled) = (start.clone(), start.clone());
    for k in 0..5 {
        let e = sgd_step(eager.clone()).expect("eager step");
        let c: Vec<Tensor> = step.call(compiled.clone()).expect("compiled step");
        for (a, b) in c.iter().zip(&e) {
            let (a, b) = (a.to_data().unwrap(), b.to_data().unwrap());
            let ok = a.values().iter().zip(b.values()).all(|(p, q)| (p - q).abs() <= 1e-5 * (1.0 + q.abs()));
            assert!(ok, "step {k}: compiled {:?} vs eager {:?}", a.values(), b.values());
        }
        assert_eq!(c[1].device_name(), Some(rt.name()), "the weights stay on the device");
        eager = vec![start[0].clone(), e[1].clone(), e[2].clone(), start[3].clone()];
        compiled = vec![start[0].clone(), c[1].clone(), c[2].clone(), start[3].clone()];
    }
    assert!(step.stats().cache_hits >= 3, "later steps reuse the compiled step: {:?}", step.stats());
}

proptest::proptest! {
    // A fixed seed: the same 24 cases every run (a failure replays exactly).
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 24,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x6b696c6e),
        ..Default::default()
    })]
    /// Random shapes (rank 1–3, sizes 1–4) and broadcast patterns: reductions over the first and last
    /// axes, softmax and a broadcast operand all check against finite differences.
    #[test]
    fn random_shapes_and_axes(dims in proptest::collection::vec(1usize..5, 1..4), pick in 0usize..64, op in 0usize..4) {
        // The broadcast operand: size 1 where `pick`'s bits say so.
        let small: Vec<usize> = dims.iter().enumerate().map(|(i, &d)| if pick >> i & 1 == 1 { 1 } else { d }).collect();
        let specs = [spec(&dims), spec(&small), spec(&dims)];
        let f: F = match op {
            0 => |t| { let a = t[0].shape().rank() as isize - 1; total(t[0].add(&t[1])?.sum(&[a], true)?.exp()?.mul(&t[2].sum(&[a], true)?)?) },
            1 => |t| total(t[0].mul(&t[1])?.max(&[0], true)?.mul(&t[2].max(&[0], true)?)?),
            2 => |t| total(t[0].sub(&t[1])?.softmax(-1)?.mul(&t[2])?),
            _ => |t| total(t[0].div(&t[1].abs()?.add(1.0)?)?.mean(&[0], false)?.tanh()?),
        };
        // Continuous values: a reduction's max has no ties (a tie of three would split the gradient in
        // thirds, which a central difference sees as a half); `abs` stays off its kink.
        check("random shapes", &specs, f, &[0, 1, 2], if op == 3 { off_zero } else { same });
    }
}
