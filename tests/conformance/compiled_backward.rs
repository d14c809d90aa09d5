//! `loss.backward()` and in-place updates inside a compiled function, as torch users write a training
//! step: the gradients land in `.grad` on the call that traces and on every cached call after,
//! accumulate as torch's do, feed an update in the same graph that `assign`s the parameters, and match
//! the eager backward and update on the same backend; an assigned or returned weight is the tensor as it
//! is at each call, never a copy frozen when traced.

use kiln::graph::{compile, Backend, Tensor};
use kiln::no_grad;
use std::sync::Arc;

fn values(t: &Tensor) -> Vec<f64> {
    t.to_data().unwrap().values().to_vec()
}

#[track_caller]
fn assert_close(got: &Tensor, want: &[f64], what: &str) {
    let got = values(got);
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 2e-5 * (1.0 + w.abs()), "{what}: got {got:?}, want {want:?}");
    }
}

fn on(b: &Arc<dyn Backend>, v: &[f32], dims: &[usize]) -> Tensor {
    let t = Tensor::from_slice(v, dims).unwrap();
    match b.runtime() {
        Some(rt) => t.to(rt).unwrap(),
        None => t,
    }
}

fn seq(n: usize, scale: f32, shift: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 % 11) as f32 - 5.0) * scale + shift).collect()
}

/// `mean((tanh(x @ w + b) − y)²)`.
fn loss(x: &Tensor, w: &Tensor, b: &Tensor, y: &Tensor) -> kiln::graph::Result<Tensor> {
    let r = x.matmul(w)?.add(b)?.tanh()?.sub(y)?;
    r.mul(&r)?.mean(&[0, 1], false)
}

/// A train step written as in torch — forward, `backward()`, an SGD update read from `.grad` — compiled
/// once and called three times, against the eager backward on the same backend.
pub fn compiled_backward(be: &Arc<dyn Backend>) {
    let x = on(be, &seq(24, 0.1, 0.0), &[6, 4]);
    let y = on(be, &seq(18, 0.05, 0.1), &[6, 3]);
    let w = on(be, &seq(12, 0.2, -0.1), &[4, 3]).requires_grad_(true).unwrap();
    let b = on(be, &seq(3, 0.3, 0.0), &[3]).requires_grad_(true).unwrap();
    // Eager, on this backend.
    loss(&x, &w, &b, &y).unwrap().backward().unwrap();
    let (gw, gb) = (values(&w.grad().unwrap()), values(&b.grad().unwrap()));
    let sgd = |p: &[f64], g: &[f64]| -> Vec<f64> { p.iter().zip(g).map(|(p, g)| p - 0.5 * g).collect() };
    let (want_w, want_b) = (sgd(&values(&w), &gw), sgd(&values(&b), &gb));
    w.zero_grad();
    b.zero_grad();

    let step = compile(|(x, y): (&Tensor, &Tensor)| {
        let l = loss(x, &w, &b, y)?;
        l.backward()?;
        let update = |p: &Tensor| no_grad(|| p.sub(&p.grad().expect("backward() set .grad").mul(0.5)?));
        Ok((l, update(&w)?, update(&b)?))
    })
    .backend(be.clone());
    for call in 0..3 {
        let (_, new_w, new_b): (Tensor, Tensor, Tensor) = step.call((&x, &y)).unwrap();
        assert_close(&w.grad().expect("call left w.grad"), &gw, &format!("call {call}: w.grad"));
        assert_close(&b.grad().expect("call left b.grad"), &gb, &format!("call {call}: b.grad"));
        assert_close(&new_w, &want_w, &format!("call {call}: the update read from w.grad"));
        assert_close(&new_b, &want_b, &format!("call {call}: the update read from b.grad"));
        w.zero_grad();
        b.zero_grad();
    }
    let stats = step.stats();
    assert_eq!((stats.traces, stats.cache_hits), (1, 2), "traced once, cached after: {stats:?}");

    // Without zero_grad the gradients accumulate: the second call finds w.grad set (traced with none),
    // traces again once, and the third is that entry's.
    let acc = compile(|(x, y): (&Tensor, &Tensor)| {
        let l = loss(x, &w, &b, y)?;
        l.backward()?;
        Ok(l)
    })
    .backend(be.clone());
    for k in 1..=3 {
        let _: Tensor = acc.call((&x, &y)).unwrap();
        let want: Vec<f64> = gw.iter().map(|g| g * f64::from(k)).collect();
        assert_close(&w.grad().unwrap(), &want, &format!("after {k} calls: gradients accumulate"));
    }
    let stats = acc.stats();
    assert_eq!((stats.traces, stats.cache_hits), (2, 1), "one trace per .grad state: {stats:?}");
    w.zero_grad();
    b.zero_grad();

    // A leaf passed as an argument: its gradient goes to the tensor of each call.
    let xs = compile(|(x, w): (&Tensor, &Tensor)| {
        let l = x.mul(x)?.mul(w)?.sum(&[0, 1], false)?;
        l.backward()?;
        Ok(l)
    })
    .backend(be.clone());
    let w2 = on(be, &seq(24, 0.5, 1.0), &[6, 4]);
    for (i, scale) in [0.1f32, 0.3].into_iter().enumerate() {
        let xi = on(be, &seq(24, scale, 0.0), &[6, 4]).requires_grad_(true).unwrap();
        let _: Tensor = xs.call((&xi, &w2)).unwrap();
        let want: Vec<f64> = values(&xi).iter().zip(values(&w2)).map(|(x, w)| 2.0 * x * w).collect();
        assert_close(&xi.grad().expect("the argument's gradient"), &want, &format!("argument leaf, call {i}"));
    }
    assert!(w2.grad().is_none(), "w2 does not require grad");
}

/// The whole loop body compiled as torch users write it: forward, `backward()`, each parameter updated
/// in place from its `.grad` under `no_grad`, `.grad` cleared — against the same loop run eagerly.
pub fn compiled_train_loop(be: &Arc<dyn Backend>) {
    let x = on(be, &seq(24, 0.1, 0.0), &[6, 4]);
    let y = on(be, &seq(18, 0.05, 0.1), &[6, 3]);
    let fresh = || {
        let w = on(be, &seq(12, 0.2, -0.1), &[4, 3]).requires_grad_(true).unwrap();
        let b = on(be, &seq(3, 0.3, 0.0), &[3]).requires_grad_(true).unwrap();
        (w, b)
    };
    let sgd_step = |w: &Tensor, b: &Tensor, x: &Tensor, y: &Tensor| -> kiln::graph::Result<Tensor> {
        let l = loss(x, w, b, y)?;
        l.backward()?;
        no_grad(|| -> kiln::graph::Result<()> {
            for p in [w, b] {
                p.assign(&p.sub(&p.grad().expect("backward() set .grad").mul(0.5)?)?)?;
                p.zero_grad();
            }
            Ok(())
        })?;
        Ok(l)
    };
    let (we, be_) = fresh();
    let eager: Vec<f64> = (0..4).map(|_| values(&sgd_step(&we, &be_, &x, &y).unwrap())[0]).collect();
    let (w, b) = fresh();
    let step = compile(|(x, y): (&Tensor, &Tensor)| sgd_step(&w, &b, x, y)).backend(be.clone());
    let compiled: Vec<f64> = (0..4).map(|_| values(&step.call((&x, &y)).unwrap())[0]).collect();
    for (k, (c, e)) in compiled.iter().zip(&eager).enumerate() {
        assert!((c - e).abs() <= 2e-5 * (1.0 + e.abs()), "step {k}: loss {c} compiled, {e} eager");
    }
    assert!(compiled[3] < compiled[0], "the loss falls: {compiled:?}");
    assert_close(&w, &values(&we), "w after four compiled steps");
    assert_close(&b, &values(&be_), "b after four compiled steps");
    assert!(w.grad().is_none() && b.grad().is_none(), "zero_grad inside the step cleared .grad");
    let stats = step.stats();
    assert_eq!((stats.traces, stats.cache_hits), (1, 3), "traced once: {stats:?}");
}

/// A captured weight assigned or returned by a compiled function is the tensor as it is at each call.
pub fn assigned_and_captured_tensors(be: &Arc<dyn Backend>) {
    // A counter updated in place: every call adds one, traced or cached.
    let count = on(be, &[0.0], &[1]);
    let tick = compile(|x: &Tensor| {
        count.assign(&count.add(x)?)?;
        count.mul(10.0)
    })
    .backend(be.clone());
    let one = on(be, &[1.0], &[1]);
    for k in 1..=3 {
        let tens: Tensor = tick.call(&one).unwrap();
        assert_eq!(values(&count), vec![f64::from(k)], "call {k}: the counter");
        assert_eq!(values(&tens), vec![10.0 * f64::from(k)], "call {k}: ops after the assign read the new value");
    }
    assert_eq!(tick.stats().traces, 1, "{:?}", tick.stats());
    // A weight returned unchanged, reassigned between calls.
    let w = on(be, &[1.0, 2.0], &[2]);
    let pair = compile(|x: &Tensor| Ok((x.add(&w)?, w.clone()))).backend(be.clone());
    let x = on(be, &[0.5, 0.5], &[2]);
    let _: (Tensor, Tensor) = pair.call(&x).unwrap();
    w.assign(&on(be, &[5.0, 6.0], &[2])).unwrap();
    let (sum, same): (Tensor, Tensor) = pair.call(&x).unwrap();
    assert_eq!(values(&sum), vec![5.5, 6.5]);
    assert_eq!(values(&same), vec![5.0, 6.0], "the returned weight is the weight now, not as traced");
    assert_eq!(same.id(), w.id(), "the same tensor, as torch returns it");
    // A host read of an assigned tensor inside the function runs the graph first.
    let v = on(be, &[3.0], &[1]);
    let read = compile(|x: &Tensor| {
        v.assign(&v.mul(x)?)?;
        let now: Vec<f32> = v.to_vec()?;
        Tensor::from_slice(&now, &[1])
    })
    .backend(be.clone());
    let r: Tensor = read.call(&on(be, &[2.0], &[1])).unwrap();
    assert_eq!(values(&r), vec![6.0]);
    assert_eq!(values(&v), vec![6.0]);
}
