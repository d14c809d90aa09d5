//! The layers of `graph::layers` against their definitions, computed here in f64 by hand-written loops
//! (not by kiln's ops), their errors, and the attribution of every node to the caller's line.

use kiln_graph::{capture, DType, Error, Result, Tensor, TensorSpec};

fn t(v: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_slice(v, dims).unwrap()
}

fn close(got: &Tensor, want: &[f64]) {
    let g = got.to_data().unwrap().values().to_vec();
    assert_eq!(g.len(), want.len());
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        let ok = if b.is_nan() { a.is_nan() } else { (a - b).abs() <= 1e-5 * (1.0 + b.abs()) };
        assert!(ok, "element {i}: got {a}, want {b} (all {g:?})");
    }
}

/// [2, 3, 2]: two samples, three channels, two positions.
fn sample() -> (Vec<f32>, Tensor) {
    let v: Vec<f32> = (0..12).map(|i| ((i * 7) % 11) as f32 * 0.5 - 2.0).collect();
    let x = t(&v, &[2, 3, 2]);
    (v, x)
}

#[test]
fn batch_norm_uses_the_running_statistics() {
    let (v, x) = sample();
    let (mean, var, w, b) = ([0.5f32, -1.0, 2.0], [1.0f32, 4.0, 0.25], [2.0f32, 1.0, -1.0], [0.0f32, 1.0, 3.0]);
    let y = x.batch_norm(&t(&mean, &[3]), &t(&var, &[3]), Some(&t(&w, &[3])), Some(&t(&b, &[3])), 1e-5).unwrap();
    let want: Vec<f64> = (0..12)
        .map(|i| {
            let c = (i / 2) % 3;
            (v[i] as f64 - mean[c] as f64) / (var[c] as f64 + 1e-5).sqrt() * w[c] as f64 + b[c] as f64
        })
        .collect();
    close(&y, &want);
    // Without the affine parameters.
    let y = x.batch_norm(&t(&mean, &[3]), &t(&var, &[3]), None, None, 1e-3).unwrap();
    let want: Vec<f64> =
        (0..12).map(|i| (v[i] as f64 - mean[(i / 2) % 3] as f64) / (var[(i / 2) % 3] as f64 + 1e-3).sqrt()).collect();
    close(&y, &want);
}

/// Mean and biased variance of `v[idx]`.
fn stats(v: &[f32], idx: &[usize]) -> (f64, f64) {
    let n = idx.len() as f64;
    let m = idx.iter().map(|&i| v[i] as f64).sum::<f64>() / n;
    (m, idx.iter().map(|&i| (v[i] as f64 - m).powi(2)).sum::<f64>() / n)
}

#[test]
fn instance_and_group_norm_normalise_their_groups() {
    let (v, x) = sample();
    let (w, b) = ([1.5f32, -0.5, 1.0], [0.25f32, 0.0, -1.0]);
    // Instance: each (sample, channel) over its two positions.
    let y = x.instance_norm(Some(&t(&w, &[3])), Some(&t(&b, &[3])), 1e-5).unwrap();
    let want: Vec<f64> = (0..12)
        .map(|i| {
            let (m, var) = stats(&v, &[i / 2 * 2, i / 2 * 2 + 1]);
            let c = (i / 2) % 3;
            (v[i] as f64 - m) / (var + 1e-5).sqrt() * w[c] as f64 + b[c] as f64
        })
        .collect();
    close(&y, &want);
    // One group per channel is instance norm; one group for all is each sample over everything.
    close(&x.group_norm(3, Some(&t(&w, &[3])), Some(&t(&b, &[3])), 1e-5).unwrap(), &want);
    let y = x.group_norm(1, None, None, 1e-5).unwrap();
    let want: Vec<f64> = (0..12)
        .map(|i| {
            let s = i / 6 * 6;
            let (m, var) = stats(&v, &(s..s + 6).collect::<Vec<_>>());
            (v[i] as f64 - m) / (var + 1e-5).sqrt()
        })
        .collect();
    close(&y, &want);
}

#[test]
fn activations_follow_their_definitions() {
    let v = [-4.0f32, -1.0, -0.25, 0.0, 0.5, 2.0, 5.0, f32::NAN];
    let x = t(&v, &[8]);
    let each = |f: fn(f64) -> f64| -> Vec<f64> { v.iter().map(|&a| f(a as f64)).collect() };
    close(&x.leaky_relu(0.1).unwrap(), &each(|a| if a < 0.0 { 0.1 * a } else { a }));
    close(&x.elu(0.5).unwrap(), &each(|a| if a < 0.0 { 0.5 * (a.exp() - 1.0) } else { a }));
    close(&x.hardsigmoid().unwrap(), &each(|a| (a + 3.0).clamp(0.0, 6.0) / 6.0));
    close(&x.hardswish().unwrap(), &each(|a| a * (a + 3.0).clamp(0.0, 6.0) / 6.0));
    close(&x.clamp(Some(-1.0), Some(2.0)).unwrap(), &each(|a| if a.is_nan() { a } else { a.clamp(-1.0, 2.0) }));
    close(&x.clamp(None, Some(0.0)).unwrap(), &each(|a| if a.is_nan() { a } else { a.min(0.0) }));
    // PReLU: one slope, or one per channel of [N, C, ...].
    close(&x.prelu(&t(&[0.25], &[1])).unwrap(), &each(|a| if a < 0.0 { 0.25 * a } else { a }));
    let (_, x3) = sample();
    let y = x3.prelu(&t(&[0.0, 0.5, 2.0], &[3])).unwrap();
    let (v3, _) = sample();
    let want: Vec<f64> =
        (0..12).map(|i| if v3[i] < 0.0 { [0.0, 0.5, 2.0][(i / 2) % 3] * v3[i] as f64 } else { v3[i] as f64 }).collect();
    close(&y, &want);
}

/// ELU's gradient is `alpha·exp(x)` below zero and 1 above, finite at any x: the branch `where` does not
/// pick is differentiated too, and `exp(x)` of a large positive x once made it `0 · inf = NaN`.
#[test]
fn elu_gradient_is_finite_at_large_inputs() {
    let v = [-3.0f32, -0.5, 0.5, 100.0, 1000.0, 3.0e38];
    let x = t(&v, &[6]);
    let (_, g) = kiln_graph::autodiff::value_and_grad(|a| a[0].elu(0.5)?.sum(&[0], false), &[x], &[0]).unwrap();
    let want: Vec<f64> = v.iter().map(|&a| if a < 0.0 { 0.5 * (a as f64).exp() } else { 1.0 }).collect();
    close(&g[0], &want);
}

#[test]
fn wrong_parameters_are_shape_errors_at_the_callers_line() {
    let (_, x) = sample();
    let bad = t(&[1.0, 2.0], &[2]);
    let ok = t(&[1.0, 2.0, 3.0], &[3]);
    let errors: Vec<Result<Tensor>> = vec![
        x.batch_norm(&bad, &ok, None, None, 1e-5),
        x.batch_norm(&ok, &ok, Some(&bad), None, 1e-5),
        x.instance_norm(None, Some(&bad), 1e-5),
        x.group_norm(2, None, None, 1e-5),
        x.prelu(&bad),
        t(&[1.0], &[1]).instance_norm(None, None, 1e-5),
    ];
    for (i, e) in errors.into_iter().enumerate() {
        match e {
            Err(Error::Shape { loc, msg, .. }) => {
                assert!(loc.file.ends_with("tests/layers.rs"), "case {i}: {msg} at {loc}");
            }
            other => panic!("case {i}: expected a shape error, got {other:?}"),
        }
    }
}

#[test]
fn every_node_of_a_layer_is_the_callers_line() {
    let specs = [TensorSpec::new(DType::F32, &[2, 4, 3]), TensorSpec::new(DType::F32, &[4])];
    let g = capture(&specs, |a| Ok(vec![a[0].group_norm(2, Some(&a[1]), Some(&a[1]), 1e-5)?.hardswish()?])).unwrap();
    let lines: std::collections::BTreeSet<u32> =
        g.nodes.iter().filter(|n| !matches!(n.op, kiln_graph::ir::Op::Input { .. })).map(|n| n.loc.line).collect();
    assert_eq!(lines.len(), 1, "one user line: {lines:?}");
    assert!(g
        .nodes
        .iter()
        .all(|n| n.loc.file.ends_with("tests/layers.rs") || matches!(n.op, kiln_graph::ir::Op::Input { .. })));
}

#[test]
fn padding_modes_fill_the_border_as_torch_does() {
    use kiln_graph::layers::PadMode;
    // [2, 3]: rows [1 2 3] and [4 5 6]; the last axis padded (2, 1), the first (1, 0).
    let x = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let cases: [(PadMode, [f64; 18]); 3] = [
        (
            PadMode::Reflect,
            // Rows: the reflected row above is row 1; each row [r0 r1 r2] → r2 r1 r0 r1 r2 r1.
            [6., 5., 4., 5., 6., 5., 3., 2., 1., 2., 3., 2., 6., 5., 4., 5., 6., 5.],
        ),
        (PadMode::Replicate, [1., 1., 1., 2., 3., 3., 1., 1., 1., 2., 3., 3., 4., 4., 4., 5., 6., 6.]),
        (PadMode::Circular, [5., 6., 4., 5., 6., 4., 2., 3., 1., 2., 3., 1., 5., 6., 4., 5., 6., 4.]),
    ];
    for (mode, want) in cases {
        let y = x.pad_with(&[(1, 0), (2, 1)], mode).unwrap();
        assert_eq!(y.shape().as_concrete(), Some(vec![3, 6]), "{mode:?}");
        close(&y, &want);
    }
    close(&x.pad_with(&[(0, 0), (1, 0)], PadMode::Constant(9.0)).unwrap(), &[9., 1., 2., 3., 9., 4., 5., 6.]);
    // Reflect needs pads below the size; circular at most the size.
    for (pads, mode) in [([(0, 0), (3, 0)], PadMode::Reflect), ([(0, 0), (0, 4)], PadMode::Circular)] {
        let e = x.pad_with(&pads, mode);
        assert!(matches!(&e, Err(Error::Shape { loc, .. }) if loc.file.ends_with("tests/layers.rs")), "{e:?}");
    }
}
