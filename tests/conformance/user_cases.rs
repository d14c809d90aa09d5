//! Wrong answers and panics found by using kiln as a user would, replayed on every backend: aliased
//! arguments, a tensor that is both an argument and a captured weight, run-time checks (integer
//! division by zero, out-of-range gather indices) reported as typed errors at the user's line, dynamic
//! shapes through reshapes and broadcasts, and sizes too large to hold.

use kiln::graph::{compile, Backend, DType, Dynamic, Error, Tensor};
use std::sync::Arc;

fn f32s(v: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_slice(v, dims).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_data().unwrap().values().to_vec()
}

#[track_caller]
fn assert_values(t: &Tensor, want: &[f64]) {
    let got = values(t);
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(want) {
        let same =
            if w.is_finite() { (g - w).abs() <= 1e-5 * w.abs().max(1.0) } else { g == w || w.is_nan() && g.is_nan() };
        assert!(same, "got {got:?}, want {want:?}");
    }
}

/// `f(&x, &x)` then `f(&x, &y)`: the second call must not reuse the graph traced with one input.
pub fn aliased_arguments(b: &Arc<dyn Backend>) {
    let f = compile(|(a, c): (&Tensor, &Tensor)| a.sub(c)).backend(b.clone());
    let x = f32s(&[1.0, 2.0, 3.0], &[3]);
    let y = f32s(&[0.5, 0.5, 4.0], &[3]);
    assert_values(&f.call((&x, &x)).unwrap(), &[0.0, 0.0, 0.0]);
    assert_values(&f.call((&x, &y)).unwrap(), &[0.5, 1.5, -1.0]);
    assert_values(&f.call((&y, &y)).unwrap(), &[0.0, 0.0, 0.0]);
    assert_values(&f.call((&y, &x)).unwrap(), &[-0.5, -1.5, 1.0]);
}

/// A function that adds a captured weight, called with the weight itself and with other tensors, in
/// both orders: every result is `a + w`.
pub fn argument_that_is_a_captured_weight(b: &Arc<dyn Backend>) {
    let w = f32s(&[10.0, 20.0], &[2]);
    let x = f32s(&[1.0, 2.0], &[2]);
    let y = f32s(&[3.0, 4.0], &[2]);
    let g = compile(|a: &Tensor| a.add(&w)).backend(b.clone());
    assert_values(&g.call(&w).unwrap(), &[20.0, 40.0]);
    assert_values(&g.call(&x).unwrap(), &[11.0, 22.0]);
    assert_values(&g.call(&y).unwrap(), &[13.0, 24.0]);
    assert_values(&g.call(&w).unwrap(), &[20.0, 40.0]);
    let h = compile(|a: &Tensor| a.add(&w)).backend(b.clone());
    assert_values(&h.call(&x).unwrap(), &[11.0, 22.0]);
    assert_values(&h.call(&w).unwrap(), &[20.0, 40.0]);
    assert_values(&h.call(&y).unwrap(), &[13.0, 24.0]);
    let s = h.stats();
    assert!(s.traces <= 3, "verified entries are reused: {s:?}");
}

/// The call's result read on the host: device backends report a failed run-time check at the first host
/// read after the run (as CUDA reports device-side asserts), the reference at the call.
#[track_caller]
fn assert_runtime_error(r: kiln::Result<Tensor>, op: &str, line: u32) {
    match r.and_then(|t| t.to_data()) {
        Err(Error::Runtime { op: got, loc, msg }) => {
            assert_eq!(got, op, "{msg}");
            assert!(loc.file.ends_with("user_cases.rs") && loc.line == line, "error at {loc}, want line {line}: {msg}");
        }
        other => panic!("expected a run-time error from `{op}` at line {line}, got {other:?}"),
    }
}

/// Integer division by zero and out-of-range gather indices are errors on every backend (as the
/// reference and `docs/ops.md` say), naming the op and the user's line; valid inputs still work after.
pub fn run_time_checks(b: &Arc<dyn Backend>) {
    let div_line = line!() + 1;
    let div = compile(|(a, c): (&Tensor, &Tensor)| a.div(c)).backend(b.clone());
    let a = Tensor::from_slice(&[7i32, 8, 9, -7], &[4]).unwrap();
    let zero = Tensor::from_slice(&[2i32, 0, 3, 2], &[4]).unwrap();
    assert_runtime_error(div.call((&a, &zero)), "div", div_line);
    let ok = Tensor::from_slice(&[2i32, 4, 3, 2], &[4]).unwrap();
    assert_eq!(div.call((&a, &ok)).unwrap().to_vec::<i32>().unwrap(), vec![3, 2, 3, -4]);

    let sel_line = line!() + 1;
    let select = compile(|(x, i): (&Tensor, &Tensor)| x.index_select(0, i)?.mul(2.0)).backend(b.clone());
    let x = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    for bad in [[0i64, 3], [-1, 1]] {
        let idx = Tensor::from_slice(&bad, &[2]).unwrap();
        assert_runtime_error(select.call((&x, &idx)), "index_select", sel_line);
    }
    let idx = Tensor::from_slice(&[2i64, 0], &[2]).unwrap();
    assert_values(&select.call((&x, &idx)).unwrap(), &[10.0, 12.0, 2.0, 4.0]);

    let gather_line = line!() + 1;
    let gather = compile(|(x, i): (&Tensor, &Tensor)| x.gather(1, i)).backend(b.clone());
    let idx = Tensor::from_slice(&[0i64, 2, 1, 1, 0, 0], &[3, 2]).unwrap();
    assert_runtime_error(gather.call((&x, &idx)), "gather", gather_line);
}

/// A dim made symbolic by a recompile (or `Dynamic::Always`) still reshapes: `-1` is solved
/// symbolically under a divisibility guard, an equality becomes a guard, and a reshape that really does
/// not fit is the user's error showing the sizes they passed.
pub fn dynamic_reshapes(b: &Arc<dyn Backend>) {
    let heads = compile(|x: &Tensor| x.reshape(&[-1, 4])?.sum(&[1], false)).backend(b.clone());
    let data = |n: usize| Tensor::from_slice(&(0..n).map(|v| v as f32).collect::<Vec<_>>(), &[2, n / 2]).unwrap();
    let sums = |n: usize| (0..n / 4).map(|r| (0..4).map(|c| (r * 4 + c) as f64).sum()).collect::<Vec<f64>>();
    for n in [12, 16, 20, 24] {
        assert_values(&heads.call(&data(n)).unwrap(), &sums(n));
    }
    assert!(heads.stats().traces <= 2, "{:?}", heads.stats());
    let odd = Tensor::from_slice(&[0.0f32; 14], &[2, 7]).unwrap();
    match heads.call(&odd) {
        Err(e @ Error::Reshape { .. }) => assert!(e.to_string().contains("[2, 7]"), "{e}"),
        other => panic!("expected a reshape error, got {other:?}"),
    }

    let always =
        compile(|x: &Tensor| x.reshape(&[-1, 4])?.sum(&[0], false)).backend(b.clone()).dynamic(Dynamic::Always);
    let x = Tensor::from_slice(&(0..12).map(|v| v as f32).collect::<Vec<_>>(), &[3, 4]).unwrap();
    assert_values(&always.call(&x).unwrap(), &[12.0, 15.0, 18.0, 21.0]);

    let flat = compile(|x: &Tensor| x.reshape(&[16])?.mul(2.0)).backend(b.clone());
    for dims in [[4, 4], [2, 8], [8, 2]] {
        let x = Tensor::from_slice(&[1.0f32; 16], &dims).unwrap();
        assert_values(&flat.call(&x).unwrap(), &[2.0; 16]);
    }
    assert!(matches!(flat.call(&Tensor::from_slice(&[1.0f32; 9], &[3, 3]).unwrap()), Err(Error::Reshape { .. })));

    // A dynamic feature dim meeting a weight's fixed size: specialised with a guard, not an error.
    let w = f32s(&[1.0; 12], &[3, 4]);
    let lin = compile(|x: &Tensor| x.linear(&w, None)).backend(b.clone()).dynamic(Dynamic::Always);
    for rows in [2, 5] {
        let x = Tensor::from_slice(&vec![1.0f32; rows * 4], &[rows, 4]).unwrap();
        assert_values(&lin.call(&x).unwrap(), &vec![4.0; rows * 3]);
    }
}

/// A broadcast error after a dim went symbolic names the sizes the user passed.
pub fn broadcast_errors_show_sizes(b: &Arc<dyn Backend>) {
    let f = compile(|(a, c): (&Tensor, &Tensor)| a.add(c)).backend(b.clone()).dynamic(Dynamic::Always);
    let a = f32s(&[0.0; 6], &[2, 3]);
    f.call((&a, &f32s(&[0.0; 3], &[3]))).unwrap();
    match f.call((&a, &f32s(&[0.0; 4], &[4]))) {
        Err(e @ Error::Broadcast { .. }) => {
            let m = e.to_string();
            assert!(m.contains("[2, 3]") && m.contains("[4]"), "{m}");
        }
        other => panic!("expected a broadcast error, got {other:?}"),
    }
}

/// Sizes no machine holds are typed errors, never panics or aborts.
pub fn huge_sizes(b: &Arc<dyn Backend>) {
    let x = f32s(&[1.0], &[1]);
    let big = 1isize << 32;
    let r = compile(|x: &Tensor| x.expand(&[big, big])?.reshape(&[big, big, 1])).backend(b.clone()).call(&x);
    assert!(matches!(r, Err(Error::TooLarge { .. })), "{r:?}");
    let e = 1isize << 40;
    let r = compile(|x: &Tensor| x.reshape(&[1, 1, 1, 1])?.expand(&[e, e, 2, 3])).backend(b.clone()).call(&x);
    assert!(matches!(r, Err(Error::TooLarge { .. })), "{r:?}");
    let r = compile(|x: &Tensor| Tensor::zeros(&[1 << 40], DType::F32)?.add(x)).backend(b.clone()).call(&x);
    assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}");
    // The device (or host) still runs a normal call afterwards.
    let ok: Tensor = compile(|x: &Tensor| x.add(1.0)).backend(b.clone()).call(&x).unwrap();
    assert_values(&ok, &[2.0]);
}

/// A graph whose output is its input, as a saved or minimized graph can be (a trace never makes one: it
/// returns the argument itself). Found by `kiln check --minimize`: the output was written by a kernel
/// binding the input's buffer as both read and write, which wgpu rejected with a panic.
pub fn output_is_an_input(b: &Arc<dyn Backend>) {
    use kiln::graph::ir::{Graph, InputKind};
    let mut g = Graph::new();
    let x = g.add_input(
        kiln::graph::DType::F32,
        kiln::graph::shape::Shape::from_dims(&[3, 5]),
        InputKind::Arg { index: 0 },
        kiln::SourceLoc::internal(),
    );
    let y = g.add_input(
        kiln::graph::DType::F32,
        kiln::graph::shape::Shape::from_dims(&[3, 5]),
        InputKind::Arg { index: 1 },
        kiln::SourceLoc::internal(),
    );
    g.outputs = vec![y, x, y];
    let inputs = kiln::graph::check::seeded_inputs(&g).unwrap();
    let case = kiln::graph::minimize::Case { graph: g, inputs };
    let report = case.check(std::slice::from_ref(b)).unwrap();
    assert!(report.passed(), "{report}");
    assert_eq!(report.outputs.iter().filter(|o| o.passed()).count(), 6, "three outputs, two modes:\n{report}");
}

/// Found by the ONNX node tests (`IsInf`): serde_json writes +inf, -inf and NaN alike (`null`), so the
/// compile-cache key and kernel id of `x == -inf` equalled those of `x == inf`, and the second function
/// ran the first one's kernel. Each constant must give its own answer, in any order.
pub fn non_finite_constants(b: &Arc<dyn Backend>) {
    let x = f32s(&[-1.5, f32::NAN, f32::INFINITY, 2.0, f32::NEG_INFINITY], &[5]);
    for (c, want) in [
        (f64::NEG_INFINITY, [0.0, 0.0, 0.0, 0.0, 1.0]),
        (f64::INFINITY, [0.0, 0.0, 1.0, 0.0, 0.0]),
        (f64::NAN, [0.0; 5]),
    ] {
        let f = compile(move |x: &Tensor| x.eq(c)).backend(b.clone());
        assert_values(&f.call(&x).unwrap(), &want);
    }
    let pads = [f64::INFINITY, f64::NEG_INFINITY];
    for p in pads {
        let f = compile(move |x: &Tensor| x.pad(&[(1, 0)], p)).backend(b.clone());
        assert_values(&f.call(&x.slice(0, 3, None, 1).unwrap()).unwrap(), &[p, 2.0, f64::NEG_INFINITY]);
    }
}

/// Tensors of 3·2^30 elements (12 GiB of f32 each), past where 32-bit indexing wraps: W1 elementwise, a
/// softmax over rows that start past 2^31 elements in, and a full sum. 3·2^30 is below 2^32: these cross
/// the signed 32-bit index and 2^32 bytes (the points past 2^32 elements apply only to a larger `n`).
/// Each result is read where a wrapped index would land elsewhere and checked against the reference
/// on the values the device holds there. A device that cannot hold such a tensor must say so with a
/// typed error naming its limit: that error is returned, for the caller to accept or not.
pub fn three_times_two_to_the_30(b: &Arc<dyn Backend>) -> kiln::graph::Result<()> {
    big_tensors(b, 3 << 30)
}

/// [`three_times_two_to_the_30`]'s checks for `n` elements (a multiple of 1024), at the positions below `n`.
pub fn big_tensors(b: &Arc<dyn Backend>, n: usize) -> kiln::graph::Result<()> {
    use kiln::graph::{workloads, CpuReference};
    let zero = Tensor::from_slice(&[0.0f32], &[1])?;
    let on_host = |t: &Tensor| -> kiln::graph::Result<Tensor> {
        Tensor::from_slice(&t.to_vec::<f32>()?, &t.shape().as_concrete().unwrap_or_default())
    };
    let host_compiled = |f: fn(&[Tensor]) -> kiln::graph::Result<Vec<Tensor>>, x: Tensor| {
        compile(move |x: &Tensor| f(std::slice::from_ref(x))).backend(CpuReference).call(&x)
    };
    // W1 on a ramp (made on the device: nothing this size crosses from the host).
    let w1 = compile(|z: &Tensor| -> kiln::graph::Result<Vec<Tensor>> {
        let x = Tensor::arange(0.0, n as f64, 1.0, DType::F32)?.mul(1e-9)?.sub(1.5)?.add(z)?;
        let y = workloads::w1(std::slice::from_ref(&x))?.remove(0);
        Ok(vec![x, y])
    })
    .backend(b.clone());
    let xy: Vec<Tensor> = w1.call(&zero)?;
    let two31: usize = 1 << 31;
    let points = [0, 1, two31 - 1, two31, two31 + 1, 2 * two31 - 1, 2 * two31, 2 * two31 + 1, n - 2, n - 1];
    for i in points.into_iter().filter(|&i| i < n) {
        let at = |t: &Tensor| t.slice(0, i as isize, Some(i as isize + 1), 1);
        // The ramp itself, against its formula on the host: a wrapped index would place it wrong too.
        let xi = at(&xy[0])?.to_vec::<f32>()?[0] as f64;
        assert!((xi - (i as f64 * 1e-9 - 1.5)).abs() < 1e-5, "x[{i}] = {xi}");
        let want: Vec<Tensor> = host_compiled(workloads::w1, on_host(&at(&xy[0])?)?)?;
        assert_values(&at(&xy[1])?, &values(&want[0]));
    }
    drop(xy);
    // Softmax over rows of 1024: row 2^21 starts 2^31 elements in (row 2^22, at 2^32, for a larger n).
    let rows = n / 1024;
    let w2 = compile(|z: &Tensor| -> kiln::graph::Result<Vec<Tensor>> {
        let x = Tensor::arange(0.0, n as f64, 1.0, DType::F32)?
            .mul(3e-7)?
            .sin()?
            .add(z)?
            .reshape(&[rows as isize, 1024])?;
        Ok(vec![x.softmax(-1)?, x])
    })
    .backend(b.clone());
    let sx: Vec<Tensor> = w2.call(&zero)?;
    for r in [0, (1 << 21) - 1, 1 << 21, (1 << 22) + 5, rows - 1].into_iter().filter(|&r| r < rows) {
        let at = |t: &Tensor| t.slice(0, r as isize, Some(r as isize + 1), 1);
        let want: Vec<Tensor> = host_compiled(workloads::w2, on_host(&at(&sx[1])?)?)?;
        assert_values(&at(&sx[0])?, &values(&want[0]));
    }
    drop(sx);
    // Every element summed once (3·2^30 is exact in f32).
    let total: f32 = compile(|z: &Tensor| Tensor::ones(&[n], DType::F32)?.add(z)?.sum(&[0], false))
        .backend(b.clone())
        .call(&zero)?
        .item()?;
    assert_eq!(total as f64, n as f64, "every element counted once");
    Ok(())
}

/// A dim made symbolic is bounded so that its entry indexes in 32 bits; a call past that bound (here
/// a softmax over 3,221,226 rows of 1000, 3.2·10^9 elements) recompiles into an unbounded entry whose
/// kernels index in 64 bits, and rows past 2^31 elements in hold the reference's values. A device that
/// cannot hold such a tensor returns its typed limit error, for the caller to accept or not.
pub fn dynamic_dims_past_the_32_bit_bound(b: &Arc<dyn Backend>) -> kiln::graph::Result<()> {
    use kiln::graph::{workloads, CpuReference};
    let zero = Tensor::from_slice(&[0.0f32], &[1])?;
    // Rows made on the device (nothing this size crosses from the host).
    let rows_of = |rows: usize| -> kiln::graph::Result<Tensor> {
        compile(move |z: &Tensor| {
            Tensor::arange(0.0, (rows * 1000) as f64, 1.0, DType::F32)?
                .mul(3e-7)?
                .sin()?
                .add(z)?
                .reshape(&[rows as isize, 1000])
        })
        .backend(b.clone())
        .call(&zero)
    };
    let softmax = compile(|x: &Tensor| x.softmax(-1)).backend(b.clone()).dynamic(Dynamic::Auto);
    for rows in [4, 5] {
        let _: Tensor = softmax.call(&rows_of(rows)?)?;
    }
    let bounded = softmax.guards();
    assert!(bounded[1].contains("s0∈[2, 2147483]"), "{bounded:?}");
    let rows = 3_221_226;
    let x = rows_of(rows)?;
    let y: Tensor = softmax.call(&x)?;
    let s = softmax.stats();
    assert_eq!((s.recompiles, s.entries), (2, 3), "{s:?}");
    assert!(s.guard_failures[1].contains("outside s0's range"), "{:?}", s.guard_failures);
    assert!(softmax.guards()[2].contains("∞"), "the third entry is unbounded: {:?}", softmax.guards());
    // Row 2147484 is the first to start past 2^31 elements; row 4294968 would start past 2^32.
    for r in [0, 2_147_483, 2_147_484, rows - 1] {
        let at = |t: &Tensor| t.slice(0, r as isize, Some(r as isize + 1), 1);
        let row = Tensor::from_slice(&at(&x)?.to_vec::<f32>()?, &[1, 1000])?;
        let want: Vec<Tensor> =
            compile(|x: &Tensor| workloads::w2(std::slice::from_ref(x))).backend(CpuReference).call(&row)?;
        assert_values(&at(&y)?, &values(&want[0]));
    }
    Ok(())
}

/// Seeded values in [-2, 2) of `dtype`, `dims`.
fn seeded_in(dtype: DType, dims: &[usize], salt: u32) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f32> =
        (0..n as u32).map(|i| ((i.wrapping_mul(2654435761) ^ salt) % 4001) as f32 / 1000.0 - 2.0).collect();
    Tensor::from_slice(&v, dims).unwrap().cast(dtype).unwrap()
}

/// One attention shape: queries/keys/values per batch entry, head dims, how they are laid out.
struct AttentionCase {
    dtype: DType,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
    causal: bool,
    /// q, k and v are narrowed out of one wider tensor at this element offset (8: 16-byte rows; 4: rows
    /// off a 16-byte boundary, the template's 2-byte loads).
    packed_at: Option<usize>,
}

fn attention_of(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: f64) -> kiln::Result<Tensor> {
    let s = q.matmul(&k.transpose(-1, -2)?)?.mul(scale)?;
    let s = if causal { s.causal_mask()? } else { s };
    s.softmax(-1)?.matmul(v)
}

/// Attention written out (scaled, causal or not, fewer or more keys than queries, rows past one tile, heads
/// read in place out of one projection, aligned and not) in bf16, f16 and f32, against the f64 reference under
/// kiln's tolerance rule. Where `attention::fits` says the target runs the template, each becomes the fused
/// attention kernel (asserted through the compile report), so this is that template's check on every such
/// backend.
pub fn attention(b: &Arc<dyn Backend>) {
    let cases = [
        AttentionCase { dtype: DType::BF16, tq: 130, tk: 130, d: 64, dv: 64, causal: true, packed_at: None },
        AttentionCase { dtype: DType::F16, tq: 70, tk: 33, d: 16, dv: 48, causal: false, packed_at: None },
        AttentionCase { dtype: DType::BF16, tq: 33, tk: 70, d: 128, dv: 128, causal: true, packed_at: None },
        AttentionCase { dtype: DType::BF16, tq: 96, tk: 96, d: 32, dv: 32, causal: true, packed_at: Some(8) },
        AttentionCase { dtype: DType::F16, tq: 50, tk: 50, d: 32, dv: 32, causal: true, packed_at: Some(4) },
        AttentionCase { dtype: DType::BF16, tq: 1, tk: 1, d: 16, dv: 16, causal: true, packed_at: None },
        // f32: the lanes template where the target has it (several blocks and key tiles, fewer and more
        // keys than queries, keys not a multiple of a chunk, heads read in place, one key), and a head
        // dim past its registers (written out everywhere).
        AttentionCase { dtype: DType::F32, tq: 130, tk: 130, d: 64, dv: 64, causal: true, packed_at: None },
        AttentionCase { dtype: DType::F32, tq: 70, tk: 33, d: 16, dv: 48, causal: false, packed_at: None },
        AttentionCase { dtype: DType::F32, tq: 33, tk: 70, d: 32, dv: 32, causal: true, packed_at: None },
        AttentionCase { dtype: DType::F32, tq: 96, tk: 96, d: 32, dv: 32, causal: true, packed_at: Some(4) },
        AttentionCase { dtype: DType::F32, tq: 1, tk: 1, d: 4, dv: 4, causal: true, packed_at: None },
        AttentionCase { dtype: DType::F32, tq: 70, tk: 90, d: 12, dv: 24, causal: true, packed_at: None },
        AttentionCase { dtype: DType::F32, tq: 1, tk: 1, d: 8, dv: 8, causal: true, packed_at: None },
        AttentionCase { dtype: DType::F32, tq: 20, tk: 20, d: 128, dv: 128, causal: false, packed_at: None },
    ];
    for (n, c) in cases.iter().enumerate() {
        let scale = 1.0 / (c.d as f64).sqrt();
        let (q, k, v) = match c.packed_at {
            // Three heads' worth of columns; q, k, v are narrowed at `at`, `at + d` and `at + 2d` (tq = tk).
            Some(at) => {
                let wide = seeded_in(c.dtype, &[2, c.tq, at + 3 * c.d], 11 * n as u32);
                (wide.clone(), wide.clone(), wide)
            }
            None => (
                seeded_in(c.dtype, &[2, c.tq, c.d], 3 * n as u32),
                seeded_in(c.dtype, &[2, c.tk, c.d], 3 * n as u32 + 1),
                seeded_in(c.dtype, &[2, c.tk, c.dv], 3 * n as u32 + 2),
            ),
        };
        let (d, packed_at, causal) = (c.d, c.packed_at, c.causal);
        let f = move |(q, k, v): (&Tensor, &Tensor, &Tensor)| match packed_at {
            // Returned with its batch axis moved inside its rows, as heads go back into rows: the kernel
            // writes the permuted layout (row stride 2 d, batch stride d).
            Some(at) => attention_of(
                &q.narrow(-1, at, d)?,
                &k.narrow(-1, at + d, d)?,
                &v.narrow(-1, at + 2 * d, d)?,
                causal,
                scale,
            )?
            .permute(&[1, 0, 2]),
            None => attention_of(q, k, v, causal, scale),
        };
        let want = compile(f).backend(kiln::graph::CpuReference).call((&q, &k, &v)).unwrap();
        let compiled = compile(f).backend(b.clone());
        let got: Tensor = compiled.call((&q, &k, &v)).unwrap();
        let report = compiled.report();
        let kinds: Vec<String> =
            report.entries.iter().flat_map(|e| &e.graphs).flat_map(|g| &g.kernels).map(|k| k.kind.clone()).collect();
        let fused_here = b.target().is_some_and(|t| kiln::graph::attention::fits(t, c.dtype, c.d as i64, c.dv as i64));
        assert_eq!(kinds.iter().any(|k| k == "attention"), fused_here, "case {n}: kernels {kinds:?}");
        let what = format!("case {n} ({:?} tq {} tk {} d {} dv {})", c.dtype, c.tq, c.tk, c.d, c.dv);
        assert_within_rule(&got, &want, &report, &what);
    }
    // One entry with a symbolic sequence length serving two lengths, per dtype: strides and the key count
    // are expressions of the symbol, read at launch (2-byte loads: the strides are not known multiples
    // of 8).
    for dtype in [DType::BF16, DType::F32] {
        let f = |(q, k, v): (&Tensor, &Tensor, &Tensor)| attention_of(q, k, v, true, 0.125);
        let mut dynamic = compile(f).backend(b.clone());
        for arg in 0..3 {
            dynamic = dynamic.mark_dynamic(arg, 1, 2..=4096);
        }
        for (i, t) in [40u32, 97].into_iter().enumerate() {
            let [q, k, v] = [0, 1, 2].map(|j| seeded_in(dtype, &[2, t as usize, 64], 100 + 3 * i as u32 + j));
            let want = compile(f).backend(kiln::graph::CpuReference).call((&q, &k, &v)).unwrap();
            let got: Tensor = dynamic.call((&q, &k, &v)).unwrap();
            assert_within_rule(&got, &want, &dynamic.report(), &format!("{dtype:?}, symbolic length {t}"));
        }
        let report = dynamic.report();
        assert_eq!(report.entries.len(), 1, "{dtype:?}: one symbolic entry: {:?}", dynamic.guards());
        let fused_here = b.target().is_some_and(|t| kiln::graph::attention::fits(t, dtype, 64, 64));
        let fused = report.entries[0].graphs[0].kernels.iter().any(|k| k.kind == "attention");
        assert_eq!(fused, fused_here, "{dtype:?}, symbolic length: {:?}", dynamic.guards());
    }
}

/// Linear layers with what a GEMM library adds inside its call (a bias, a residual: cuBLASLt's
/// epilogue on CUDA, where `graph` fuses them), in f32, bf16 and f16: both adds, the bias alone before
/// a GELU, a residual read through a transposed view (stored first), a bias narrowed off a 16-byte
/// boundary (left to the next kernel), and one symbolic-batch entry serving two batch sizes. Sizes are
/// past `gemm::LIBRARY_MIN_MACS`, so CUDA calls the library; other backends run the template.
pub fn linear_epilogues(b: &Arc<dyn Backend>) {
    type Case = fn(&[&Tensor]) -> kiln::Result<Tensor>;
    let both: Case = |t| t[3].add(&t[0].linear(t[1], Some(t[2]))?);
    let bias_gelu: Case = |t| t[0].linear(t[1], Some(t[2]))?.gelu();
    let transposed: Case = |t| t[0].linear(t[1], None)?.add(&t[4].transpose(1, 2)?);
    let narrowed: Case = |t| t[3].add(&t[0].linear(t[1], Some(&t[5].narrow(0, 1, 64)?))?);
    let cases: [(&str, DType, Case, usize); 4] = [
        ("residual and bias", DType::F32, both, 1),
        ("bias, then gelu", DType::BF16, bias_gelu, 2),
        ("transposed residual", DType::F16, transposed, 2),
        ("unaligned bias", DType::BF16, narrowed, 2),
    ];
    let fused_here = b.target().is_some_and(|t| t.library_gemm && t.library_epilogue);
    for (n, (what, dtype, f, kernels)) in cases.into_iter().enumerate() {
        let salt = 10 * n as u32;
        let inputs = [
            seeded_in(dtype, &[3, 40, 96], salt),
            seeded_in(dtype, &[64, 96], salt + 1).mul(0.1).unwrap(),
            seeded_in(dtype, &[64], salt + 2),
            seeded_in(dtype, &[3, 40, 64], salt + 3),
            seeded_in(dtype, &[3, 64, 40], salt + 4),
            seeded_in(dtype, &[65], salt + 5),
        ];
        let g = move |t: Vec<Tensor>| f(&t.iter().collect::<Vec<_>>());
        let want: Tensor = compile(g).backend(kiln::graph::CpuReference).call(inputs.to_vec()).unwrap();
        let compiled = compile(g).backend(b.clone());
        let got: Tensor = compiled.call(inputs.to_vec()).unwrap();
        let report = compiled.report();
        if fused_here {
            let count = report.entries[0].graphs[0].kernels.len();
            assert_eq!(count, kernels, "{what}: kernels {:?}", report.entries[0].graphs[0].kernels);
        }
        assert_within_rule(&got, &want, &report, &format!("{what} ({dtype:?})"));
    }
    let f = |t: Vec<Tensor>| both(&t.iter().collect::<Vec<_>>());
    let dynamic = compile(f).backend(b.clone()).mark_dynamic(0, 0, 1..=64).mark_dynamic(3, 0, 1..=64);
    for batch in [2usize, 5] {
        let inputs = vec![
            seeded_in(DType::BF16, &[batch, 40, 96], 70),
            seeded_in(DType::BF16, &[64, 96], 71).mul(0.1).unwrap(),
            seeded_in(DType::BF16, &[64], 72),
            seeded_in(DType::BF16, &[batch, 40, 64], 73),
        ];
        let want: Tensor = compile(f).backend(kiln::graph::CpuReference).call(inputs.clone()).unwrap();
        let got: Tensor = dynamic.call(inputs).unwrap();
        assert_within_rule(&got, &want, &dynamic.report(), &format!("symbolic batch {batch}"));
    }
    assert_eq!(dynamic.report().entries.len(), 1, "one symbolic entry: {:?}", dynamic.guards());
}

/// A weighted attention's value and its gradients with respect to q, k and v (one compiled step: forward,
/// the log-sum-exps, the three gradients), in f32, bf16 and f16, causal or not, against the f64 reference under
/// kiln's tolerance rule. Where `attention::grad_fits` says the target runs the backward kernels, the
/// forward, the log-sum-exps and each gradient are fused attention kernels (asserted through the compile
/// report), so this is those kernels' check on every such backend.
pub fn attention_gradients(b: &Arc<dyn Backend>) {
    let cases = [
        AttentionCase { dtype: DType::F32, tq: 130, tk: 130, d: 64, dv: 64, causal: true, packed_at: None },
        AttentionCase { dtype: DType::F32, tq: 70, tk: 33, d: 32, dv: 16, causal: false, packed_at: None },
        AttentionCase { dtype: DType::BF16, tq: 130, tk: 130, d: 64, dv: 64, causal: false, packed_at: None },
        AttentionCase { dtype: DType::BF16, tq: 130, tk: 130, d: 64, dv: 64, causal: true, packed_at: None },
        AttentionCase { dtype: DType::F16, tq: 70, tk: 33, d: 32, dv: 64, causal: false, packed_at: None },
        AttentionCase { dtype: DType::BF16, tq: 33, tk: 70, d: 16, dv: 16, causal: true, packed_at: None },
        AttentionCase { dtype: DType::BF16, tq: 1, tk: 1, d: 16, dv: 32, causal: true, packed_at: None },
    ];
    for (n, c) in cases.iter().enumerate() {
        let scale = 1.0 / (c.d as f64).sqrt();
        let args = vec![
            seeded_in(c.dtype, &[2, c.tq, c.d], 40 + 4 * n as u32),
            seeded_in(c.dtype, &[2, c.tk, c.d], 41 + 4 * n as u32),
            seeded_in(c.dtype, &[2, c.tk, c.dv], 42 + 4 * n as u32),
            seeded_in(c.dtype, &[2, c.tq, c.dv], 43 + 4 * n as u32),
        ];
        let causal = c.causal;
        let f = move |t: Vec<Tensor>| -> kiln::Result<Vec<Tensor>> {
            let (value, grads) = kiln::value_and_grad(
                |a| attention_of(&a[0], &a[1], &a[2], causal, scale)?.mul(&a[3])?.sum(&[0, 1, 2], false),
                &t,
                &[0, 1, 2],
            )?;
            Ok([vec![value], grads].concat())
        };
        let want: Vec<Tensor> = compile(f).backend(kiln::graph::CpuReference).call(args.clone()).unwrap();
        let compiled = compile(f).backend(b.clone());
        let got: Vec<Tensor> = compiled.call(args.clone()).unwrap();
        let report = compiled.report();
        let kinds: Vec<String> =
            report.entries.iter().flat_map(|e| &e.graphs).flat_map(|g| &g.kernels).map(|k| k.kind.clone()).collect();
        // The forward, the log-sum-exps (which read no values: head dim `d` twice) and the three gradients,
        // each fused where the target runs it: the log-sum-exps come out of the forward's kernel where
        // both are fused, and the keys' and values' gradients out of one kernel. A forward only lanes
        // would run is written out beside its written-out backward (`decompose::write_out`).
        let fused = |f: fn(&kiln::graph::Target, DType, i64, i64) -> bool, d: usize, dv: usize| {
            usize::from(b.target().is_some_and(|t| f(t, c.dtype, d as i64, dv as i64)))
        };
        let expected = fused(kiln::graph::attention::matrix_fits, c.d, c.dv).max(fused(
            kiln::graph::attention::grad_fits,
            c.d,
            c.d,
        )) + 2 * fused(kiln::graph::attention::grad_fits, c.d, c.dv);
        let attentions = kinds.iter().filter(|k| *k == "attention").count();
        assert_eq!(attentions, expected, "case {n}: kernels {kinds:?}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let what = format!("case {n} ({:?} tq {} tk {} d {} dv {}), output {i}", c.dtype, c.tq, c.tk, c.d, c.dv);
            assert_within_rule(g, w, &report, &what);
        }
    }
}

/// `got` against the reference's `want` under kiln's tolerance rule for the first captured graph of
/// `report` (the reference rounds after every op as the written-out form does; the rule's depth covers it).
#[track_caller]
fn assert_within_rule(got: &Tensor, want: &Tensor, report: &kiln::graph::CompileReport, what: &str) {
    use kiln::graph::tolerance::{compare, Expected, Tolerance};
    let graph = &report.entries[0].graphs[0].captured;
    let dtype = graph.node(graph.outputs[0]).dtype;
    let tol = Tolerance::rule(dtype, kiln::graph::tolerance::depth(graph).unwrap());
    let (got, want) = (got.to_data().unwrap(), want.to_data().unwrap());
    let outcome = compare(&got, &Expected::of(&want, "reference"), tol);
    assert!(outcome.correct, "{what}: {outcome:?}");
}

/// Kernels too small to fill a device, none reading another's results (a training step's bias and
/// norm updates), run as one launch (`combine`): three row kernels of one shape, two small pointwise
/// kernels, and a kernel reading two of the rows' results, each output equal to the reference's. Where
/// the target combines launches, the compile report shows a kernel of several parts and the kernels
/// launched inside it, and the reader never shares a launch with the kernel whose result it reads.
pub fn combined_launches(b: &Arc<dyn Backend>) {
    let f = |t: Vec<Tensor>| -> kiln::Result<Vec<Tensor>> {
        let sums = t[0].sum(&[1], false)?;
        let norms = t[1].softmax(-1)?;
        let maxes = t[2].exp()?.max(&[1], false)?;
        let squares = t[3].mul(&t[3])?;
        let halves = t[4].mul(0.5)?;
        let reader = sums.add(&maxes)?.neg()?;
        Ok(vec![sums, norms, maxes, squares, halves, reader])
    };
    let inputs = vec![
        seeded_in(DType::F32, &[24, 100], 1),
        seeded_in(DType::F32, &[24, 100], 2),
        seeded_in(DType::F32, &[24, 100], 3),
        seeded_in(DType::F32, &[5, 7], 4),
        seeded_in(DType::F32, &[5, 7], 5),
    ];
    let want: Vec<Tensor> = compile(f).backend(kiln::graph::CpuReference).call(inputs.clone()).unwrap();
    let compiled = compile(f).backend(b.clone());
    let got: Vec<Tensor> = compiled.call(inputs).unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
        let close = g.iter().zip(&w).all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0));
        assert!(close && g.len() == w.len(), "output {i}: got {g:?}, want {w:?}");
    }
    if b.target().is_some_and(|t| t.combined_launch_threads > 0) {
        let report = compiled.report();
        let kernels = &report.entries[0].graphs[0].kernels;
        let kinds: Vec<&str> = kernels.iter().map(|k| k.kind.as_str()).collect();
        let hosts: Vec<&str> =
            kernels.iter().filter(|k| k.kind.ends_with("one launch")).map(|k| k.name.as_str()).collect();
        let inside = kinds.iter().filter(|k| k.starts_with("part of ")).count();
        assert!(!hosts.is_empty() && inside >= 2, "combined launches: {kinds:?}");
        // The launch each kernel runs in: its host's name for a part, else its own.
        let launch_of = |name: &str| {
            let k = kernels.iter().find(|k| k.name.contains(name)).expect("a kernel of that name");
            k.kind.strip_prefix("part of ").unwrap_or(&k.name).to_string()
        };
        assert_ne!(launch_of("neg"), launch_of("exp_max"), "the reader runs after the launch it reads: {kinds:?}");
    }
}
