//! Eager autograd, torch's familiar form: `requires_grad_`, `backward`, `.grad()`, accumulation,
//! `zero_grad`, `detach`, `no_grad`; gradients equal `value_and_grad`'s, on the host and on a device,
//! eagerly and inside compiled functions; what cannot work (a non-scalar, nothing to differentiate) is a
//! typed error.

use kiln::graph::workloads::data;
use kiln::graph::{KernelInterpreter, TensorSpec};
use kiln::{DType, Tensor};

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_data().unwrap().values().to_vec()
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(p, q)| (p - q).abs() <= 1e-5 * (1.0 + q.abs()))
}

fn tensor(dims: &[usize], salt: usize) -> Tensor {
    Tensor::from_data(data(&TensorSpec::new(DType::F32, dims), salt))
}

/// `mean((x @ w + b − y)²)` written as eager ops.
fn loss(x: &Tensor, w: &Tensor, b: &Tensor, y: &Tensor) -> kiln::Result<Tensor> {
    let r = x.matmul(w)?.add(b)?.sub(y)?;
    r.mul(&r)?.mean(&[0, 1], false)
}

#[test]
fn backward_fills_leaf_gradients_like_value_and_grad() {
    let (x, y) = (tensor(&[6, 4], 1), tensor(&[6, 3], 2));
    let w = tensor(&[4, 3], 3).requires_grad_(true).unwrap();
    let b = tensor(&[3], 4).requires_grad_(true).unwrap();
    let l = loss(&x, &w, &b, &y).unwrap();
    l.backward().unwrap();
    let (value, want) = kiln::value_and_grad(
        |t| loss(&t[0], &t[1], &t[2], &t[3]),
        &[x.clone(), w.clone(), b.clone(), y.clone()],
        &[1, 2],
    )
    .unwrap();
    assert!(close(&vals(&l), &vals(&value)));
    assert!(close(&vals(&w.grad().unwrap()), &vals(&want[0])), "dL/dw");
    assert!(close(&vals(&b.grad().unwrap()), &vals(&want[1])), "dL/db");
    assert!(x.grad().is_none() && !x.requires_grad(), "x does not require grad");
    // A second backward accumulates; zero_grad forgets.
    loss(&x, &w, &b, &y).unwrap().backward().unwrap();
    let twice: Vec<f64> = vals(&want[0]).iter().map(|g| 2.0 * g).collect();
    assert!(close(&vals(&w.grad().unwrap()), &twice), "gradients accumulate");
    w.zero_grad();
    assert!(w.grad().is_none());
}

#[test]
fn detach_and_no_grad_stop_gradients() {
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let w = Tensor::from_slice(&[0.5f32, -1.0, 2.0], &[3]).unwrap().requires_grad_(true).unwrap();
    let l = w.mul(&x).unwrap().add(w.detach().mul(&x).unwrap()).unwrap().sum(&[0], false).unwrap();
    l.backward().unwrap();
    assert_eq!(vals(&w.grad().unwrap()), vec![1.0, 2.0, 3.0], "only the attached term counts");
    let y = kiln::no_grad(|| w.mul(2.0).unwrap().sum(&[0], false).unwrap());
    let e = y.backward().unwrap_err();
    assert!(e.to_string().contains("no tensor with requires_grad"), "{e}");
}

/// A weight replaced after the forward pass: backward uses the value the forward used.
#[test]
fn backward_uses_the_values_the_forward_saw() {
    let w = Tensor::from_slice(&[3.0f32], &[1]).unwrap().requires_grad_(true).unwrap();
    let l = w.mul(&w).unwrap().sum(&[0], false).unwrap();
    w.assign(&Tensor::from_slice(&[100.0f32], &[1]).unwrap()).unwrap();
    l.backward().unwrap();
    assert_eq!(vals(&w.grad().unwrap()), vec![6.0], "d(w²)/dw at w = 3");
}

#[test]
fn what_backward_cannot_do_says_so() {
    let w = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap().requires_grad_(true).unwrap();
    let e = w.mul(2.0).unwrap().backward().unwrap_err();
    assert!(e.to_string().contains("one element"), "{e}");
    // Inside a compiled function too: a value no leaf contributed to, or one made under no_grad.
    let x = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let f = kiln::compile(|x: &Tensor| {
        let l = x.mul(x)?.sum(&[0], false)?;
        l.backward()?;
        Ok(l)
    });
    let e = f.call(&x).map(drop).expect_err("nothing requires grad");
    assert!(e.to_string().contains("no tensor with requires_grad"), "{e}");
    let g = kiln::compile(|x: &Tensor| {
        let l = kiln::no_grad(|| x.mul(&w)?.sum(&[0], false))?;
        l.backward()?;
        Ok(l)
    });
    let e = g.call(&x).map(drop).expect_err("made under no_grad");
    assert!(e.to_string().contains("no_grad"), "{e}");
}

/// `backward()` inside a compiled function traces the forward once: the graph that runs holds the
/// forward's product and the weight gradient's, not a second forward.
#[test]
fn backward_inside_compile_joins_the_trace() {
    let (x, y) = (tensor(&[6, 4], 1), tensor(&[6, 3], 2));
    let w = tensor(&[4, 3], 3).requires_grad_(true).unwrap();
    let b = tensor(&[3], 4).requires_grad_(true).unwrap();
    let (_, want) = kiln::value_and_grad(
        |t| loss(&t[0], &t[1], &t[2], &t[3]),
        &[x.clone(), w.clone(), b.clone(), y.clone()],
        &[1, 2],
    )
    .unwrap();
    let f = kiln::compile(|(x, y): (&Tensor, &Tensor)| {
        let l = loss(x, &w, &b, y)?;
        l.backward()?;
        Ok(l)
    })
    .fullgraph(true);
    let ex = f.explain((&x, &y)).unwrap();
    assert!(close(&vals(&w.grad().unwrap()), &vals(&want[0])), "dL/dw");
    assert!(close(&vals(&b.grad().unwrap()), &vals(&want[1])), "dL/db");
    assert_eq!(ex.graphs.len(), 1, "one graph: {ex}");
    let (live, _) = ex.graphs[0].graph.without_dead_nodes();
    let products = live.nodes.iter().filter(|n| n.op.name() == "matmul").count();
    assert_eq!(products, 2, "x·w and xᵀ·dL/d(xw); a second forward would make three: {ex}");
    // The partition is reported, in bytes the backward reads against keeping every value its rules use
    // (here the residual: 6 × 3 f32, nothing worth computing again at this size).
    let p = &ex.graphs[0].partitions;
    assert_eq!(p.len(), 1, "{ex}");
    let (saved, all) = (p[0].saved_bytes.as_const().unwrap(), p[0].all_bytes.as_const().unwrap());
    assert!(0 < saved && saved <= all && all <= 6 * 3 * 4 * 3, "{:?}", p[0]);
    assert!(ex.to_string().contains("backward: reads"), "{ex}");
}

/// Inside a compiled function `detach` and `no_grad` stop gradients as they do eagerly.
#[test]
fn detach_and_no_grad_inside_compile() {
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let w = Tensor::from_slice(&[0.5f32, -1.0, 2.0], &[3]).unwrap().requires_grad_(true).unwrap();
    let f = kiln::compile(|x: &Tensor| {
        let attached = w.mul(x)?;
        let detached = w.detach().mul(x)?;
        let quiet = kiln::no_grad(|| w.mul(x)?.mul(10.0))?;
        let l = attached.add(&detached)?.add(&quiet)?.sum(&[0], false)?;
        l.backward()?;
        Ok(l)
    });
    let l: Tensor = f.call(&x).unwrap();
    assert_eq!(vals(&l), vec![2.0 * (0.5 - 2.0 + 6.0) + 10.0 * (0.5 - 2.0 + 6.0)]);
    assert_eq!(vals(&w.grad().unwrap()), vec![1.0, 2.0, 3.0], "only the attached term counts");
}

/// A compiled function's loss that depends on values with a history of their own (an eager op on a
/// leaf, before the call): the backward breaks the graph and replays that history too.
#[test]
fn backward_inside_compile_through_an_eager_history() {
    let w = Tensor::from_slice(&[0.5f32, -1.0, 2.0], &[3]).unwrap().requires_grad_(true).unwrap();
    let h = w.mul(3.0).unwrap();
    let f = kiln::compile(|h: &Tensor| {
        let l = h.mul(h)?.sum(&[0], false)?;
        l.backward()?;
        Ok(l)
    });
    let ex = f.explain(&h).unwrap();
    assert!(ex.breaks.iter().any(|b| b.reason.contains("backward()")), "{ex}");
    // d/dw Σ (3w)² = 18 w
    assert!(close(&vals(&w.grad().unwrap()), &[9.0, -18.0, 36.0]), "{:?}", vals(&w.grad().unwrap()));
}

/// On a device the replayed graph runs there, the gradient stays there, and a plain SGD loop with
/// backward fits a line.
#[test]
fn backward_on_a_device_trains_a_line() {
    let rt = KernelInterpreter::default().runtime();
    let x = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0], &[4, 1]).unwrap().to(rt.clone()).unwrap();
    let y = Tensor::from_slice(&[1.0f32, 3.0, 5.0, 7.0], &[4, 1]).unwrap().to(rt.clone()).unwrap();
    let mut w = Tensor::from_slice(&[0.0f32], &[1, 1]).unwrap().to(rt.clone()).unwrap().requires_grad_(true).unwrap();
    let mut b = Tensor::from_slice(&[0.0f32], &[1]).unwrap().to(rt.clone()).unwrap().requires_grad_(true).unwrap();
    for _ in 0..300 {
        loss(&x, &w, &b, &y).unwrap().backward().unwrap();
        let (gw, gb) = (w.grad().unwrap(), b.grad().unwrap());
        assert_eq!(gw.device_name(), Some(rt.name()), "gradients stay on the device");
        let step = |p: &Tensor, g: &Tensor| kiln::no_grad(|| p.sub(&g.mul(0.1)?)?.requires_grad_(true));
        (w, b) = (step(&w, &gw).unwrap(), step(&b, &gb).unwrap());
    }
    assert!((vals(&w)[0] - 2.0).abs() < 1e-3 && (vals(&b)[0] - 1.0).abs() < 1e-3, "{:?} {:?}", vals(&w), vals(&b));
}

/// `loss = compile(f).call(..)?; loss.backward()?`, as torch users train: the compiled graph is
/// differentiated on the call that traces it and on the cached calls after, for weights passed as
/// arguments and weights the function captures.
#[test]
fn backward_through_compiled_calls() {
    let (x, y) = (tensor(&[6, 4], 1), tensor(&[6, 3], 2));
    let w = tensor(&[4, 3], 3).requires_grad_(true).unwrap();
    let b = tensor(&[3], 4).requires_grad_(true).unwrap();
    let args = vec![x.clone(), w.clone(), b.clone(), y.clone()];
    let (_, want) = kiln::value_and_grad(|t| loss(&t[0], &t[1], &t[2], &t[3]), &args, &[1, 2]).unwrap();
    let f = kiln::compile(|t: Vec<Tensor>| loss(&t[0], &t[1], &t[2], &t[3]));
    for call in 0..3 {
        w.zero_grad();
        b.zero_grad();
        let l: Tensor = f.call(args.clone()).unwrap();
        l.backward().unwrap();
        assert!(close(&vals(&w.grad().unwrap()), &vals(&want[0])), "call {call}: dL/dw");
        assert!(close(&vals(&b.grad().unwrap()), &vals(&want[1])), "call {call}: dL/db");
    }
    assert!(f.stats().cache_hits >= 1, "cached calls are differentiated too: {:?}", f.stats());
    // Captured weights: the function reads w and b from its closure.
    let g = kiln::compile(|(x, y): (&Tensor, &Tensor)| loss(x, &w, &b, y));
    for _ in 0..2 {
        w.zero_grad();
        b.zero_grad();
        let l: Tensor = g.call((&x, &y)).unwrap();
        l.backward().unwrap();
        assert!(close(&vals(&w.grad().unwrap()), &vals(&want[0])), "captured w");
        assert!(close(&vals(&b.grad().unwrap()), &vals(&want[1])), "captured b");
    }
}

/// A function split by a graph break (a host read in the middle): gradients flow through both graphs.
#[test]
fn backward_across_a_graph_break() {
    let x = tensor(&[5, 4], 7);
    let w = tensor(&[4, 2], 8).requires_grad_(true).unwrap();
    let math = |x: &Tensor, w: &Tensor| -> kiln::Result<(Tensor, Tensor)> {
        let h = x.matmul(w)?.tanh()?;
        let scale: f32 = h.sum(&[0, 1], false)?.item()?;
        let z = h.mul(&h)?.mul(2.0)?;
        Ok((z.mean(&[0, 1], false)?, Tensor::scalar(scale as f64, DType::F32)?))
    };
    let f = kiln::compile(|(x, w): (&Tensor, &Tensor)| math(x, w).map(|(l, _)| l));
    let ex = f.explain((&x, &w)).unwrap();
    assert!(!ex.breaks.is_empty() && ex.graph_count() >= 2, "the host read splits the function: {ex}");
    let (_, want) = kiln::value_and_grad(
        |t| t[0].matmul(&t[1])?.tanh()?.mul(&t[0].matmul(&t[1])?.tanh()?)?.mul(2.0)?.mean(&[0, 1], false),
        &[x.clone(), w.clone()],
        &[1],
    )
    .unwrap();
    w.zero_grad();
    let l: Tensor = f.call((&x, &w)).unwrap();
    l.backward().unwrap();
    assert!(
        close(&vals(&w.grad().unwrap()), &vals(&want[0])),
        "{:?} vs {:?}",
        vals(&w.grad().unwrap()),
        vals(&want[0])
    );
}

/// A long history (20,000 eager ops on a tensor that tracks gradients) is dropped without deep
/// recursion: a test thread's 2 MiB stack would overflow otherwise.
#[test]
fn a_long_history_drops_without_recursing() {
    let w = Tensor::from_slice(&[1.0f32], &[1]).unwrap().requires_grad_(true).unwrap();
    let mut x = w.clone();
    for _ in 0..20_000 {
        x = x.mul(1.0).unwrap();
    }
    drop(x);
    assert!(w.grad().is_none());
}

/// Dropout's gradient is its mask times 1/(1-p), recomputed from the key: the elements the forward
/// zeroed get no gradient, the others 1/(1-p); eager backward and `value_and_grad` agree, and about
/// 1-p of the elements are kept.
#[test]
fn dropout_gradients_follow_the_forward_mask() {
    let p = 0.3;
    let x = tensor(&[64, 33], 5).add(3.0).unwrap().requires_grad_(true).unwrap();
    let key = Tensor::rng_key(2026, 7);
    let y = x.dropout(p, &key).unwrap();
    y.sum(&[0, 1], false).unwrap().backward().unwrap();
    let (ys, gs) = (vals(&y), vals(&x.grad().unwrap()));
    let kept = ys.iter().filter(|&&v| v != 0.0).count();
    let scale = (1.0 / (1.0 - p)) as f32 as f64;
    for (yv, gv) in ys.iter().zip(&gs) {
        assert_eq!(*gv, if *yv == 0.0 { 0.0 } else { scale }, "y {yv}");
    }
    let frac = kept as f64 / ys.len() as f64;
    // 2,112 draws: the kept fraction's standard deviation is ~0.01.
    assert!((frac - (1.0 - p)).abs() < 0.05, "kept {frac}");
    let (_, want) =
        kiln::value_and_grad(|t| t[0].dropout(p, &t[1])?.sum(&[0, 1], false), &[x.detach(), key.clone()], &[0])
            .unwrap();
    assert_eq!(vals(&want[0]), gs, "the compiled gradient recomputes the same mask");
    // Another step's key, another mask.
    let other = vals(&x.detach().dropout(p, &Tensor::rng_key(2026, 8)).unwrap());
    assert_ne!(other.iter().map(|v| *v == 0.0).collect::<Vec<_>>(), ys.iter().map(|v| *v == 0.0).collect::<Vec<_>>());
}

#[test]
fn bad_dropout_arguments_are_typed_errors() {
    let x = tensor(&[4], 1);
    let key = Tensor::rng_key(1, 0);
    assert!(matches!(x.dropout(1.0, &key), Err(kiln::Error::InvalidArgument { .. })));
    assert!(matches!(x.dropout(-0.1, &key), Err(kiln::Error::InvalidArgument { .. })));
    let e = x.dropout(0.5, &tensor(&[2], 3)).unwrap_err();
    assert!(e.to_string().contains("i32 tensor of two elements"), "{e}");
    assert!(e.to_string().contains("autograd.rs"), "names the user's line: {e}");
}

#[test]
fn the_dropout_module_drops_in_training_only() {
    let x = tensor(&[8, 16], 2).add(5.0).unwrap();
    let key = Tensor::rng_key(3, 1);
    let mut d = kiln::nn::Dropout::new(0.5);
    let dropped = vals(&d.forward(&x, &key).unwrap());
    assert!(dropped.contains(&0.0) && dropped.iter().any(|&v| v != 0.0));
    assert_eq!(dropped, vals(&x.dropout(0.5, &key).unwrap()));
    d.training = false;
    assert_eq!(vals(&d.forward(&x, &key).unwrap()), vals(&x), "evaluation is the identity");
}

/// The shorter last batch, as Lightning's guide warns about: a compiled step with `backward()` inside
/// recompiles once for a symbolic batch (Dynamic::Auto), then serves every batch size from that entry,
/// each call leaving the right gradient.
#[test]
fn backward_inside_compile_with_a_dynamic_batch() {
    let w = tensor(&[4, 3], 3).requires_grad_(true).unwrap();
    let b = tensor(&[3], 4).requires_grad_(true).unwrap();
    let f = kiln::compile(|(x, y): (&Tensor, &Tensor)| {
        let l = loss(x, &w, &b, y)?;
        l.backward()?;
        Ok(l)
    });
    for (call, rows) in [8usize, 5, 7, 3].into_iter().enumerate() {
        let (x, y) = (tensor(&[rows, 4], 10 + call), tensor(&[rows, 3], 20 + call));
        let (_, want) = kiln::value_and_grad(
            |t| loss(&t[0], &t[1], &t[2], &t[3]),
            &[x.clone(), w.clone(), b.clone(), y.clone()],
            &[1, 2],
        )
        .unwrap();
        w.zero_grad();
        b.zero_grad();
        let _: Tensor = f.call((&x, &y)).unwrap();
        assert!(close(&vals(&w.grad().unwrap()), &vals(&want[0])), "{rows} rows: dL/dw");
        assert!(close(&vals(&b.grad().unwrap()), &vals(&want[1])), "{rows} rows: dL/db");
    }
    let s = f.stats();
    // 8 rows traced; 5 recompiled symbolic; 7 traced once more to verify the entry serves other tensors
    // (as every entry is, `compile`'s `Entry`); 3 served from it.
    let counts = (s.traces, s.recompiles, s.verifications, s.cache_hits);
    assert_eq!(counts, (2, 1, 1, 1), "one symbolic entry serves 5, 7 and 3 rows: {s:?}");
}

/// Logging after `backward()` (a host read of the loss) breaks the graph: the function traces on every
/// call, and every call still leaves its gradient.
#[test]
fn backward_inside_compile_then_a_host_read() {
    let (x, y) = (tensor(&[6, 4], 1), tensor(&[6, 3], 2));
    let w = tensor(&[4, 3], 3).requires_grad_(true).unwrap();
    let b = tensor(&[3], 4).requires_grad_(true).unwrap();
    let args = [x.clone(), w.clone(), b.clone(), y.clone()];
    let (_, want) = kiln::value_and_grad(|t| loss(&t[0], &t[1], &t[2], &t[3]), &args, &[1, 2]).unwrap();
    let f = kiln::compile(|(x, y): (&Tensor, &Tensor)| {
        let l = loss(x, &w, &b, y)?;
        l.backward()?;
        let logged: f32 = l.item()?;
        Tensor::scalar(f64::from(logged), DType::F32)
    });
    for call in 0..2 {
        let _: Tensor = f.call((&x, &y)).unwrap();
        let twice: Vec<f64> = vals(&want[0]).iter().map(|g| g * f64::from(call + 1)).collect();
        assert!(close(&vals(&w.grad().unwrap()), &twice), "call {call}: gradients accumulate across calls");
    }
}
