//! The CPU reference: executes any graph, computing floats in f64 and rounding each node's result to its
//! dtype. It is the oracle for every correctness check in kiln and, until the GPU lowerings land, the
//! `cpu` backend. It is written for clarity, not speed: every node materialises a contiguous array.

use crate::data::TensorData;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{ArgReduceOp, BinaryOp, GeluApprox, Graph, Node, Op, ReduceOp, UnaryOp};
use crate::shape::concrete_strides;
use crate::sym::{Bindings, Expr};

/// Runs `graph` on `inputs` (in `Graph::inputs` order) and returns its outputs.
pub fn run(graph: &Graph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
    run_with(graph, inputs, true)
}

/// Runs `graph` computing its math in f64: float intermediates keep every bit and only the outputs are
/// rounded to their dtypes (integers and booleans are exact as always). It separates a wrong rewrite from
/// f32 rounding on an ill-conditioned input, where no f32 computation can agree with the reference.
pub fn run_unrounded(graph: &Graph, inputs: &[&TensorData]) -> Result<Vec<TensorData>> {
    let mut out = run_with(graph, inputs, false)?;
    for t in &mut out {
        let dt = t.dtype();
        *t = TensorData::from_rounded(t.values().iter().map(|&x| dt.round(x)).collect(), t.dims().to_vec(), dt);
    }
    Ok(out)
}

fn run_with(graph: &Graph, inputs: &[&TensorData], round_floats: bool) -> Result<Vec<TensorData>> {
    if inputs.len() != graph.inputs.len() {
        return Err(Error::Runtime {
            op: "run".into(),
            msg: format!("the graph takes {} inputs, {} were given", graph.inputs.len(), inputs.len()),
            loc: crate::loc::SourceLoc::internal(),
        });
    }
    let bindings = bind_symbols(graph, inputs)?;
    let last_use = last_uses(graph);
    // Only what an output needs runs, as in compiled code: a check in an unused node (an out-of-range
    // index nobody reads) is not an error on any backend.
    let mut needed = vec![false; graph.nodes.len()];
    for o in &graph.outputs {
        needed[o.index()] = true;
    }
    for (i, node) in graph.nodes.iter().enumerate().rev() {
        if needed[i] {
            node.inputs.iter().for_each(|a| needed[a.index()] = true);
        }
    }
    let mut values: Vec<Option<TensorData>> = vec![None; graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        if !needed[i] {
            continue;
        }
        let args: Vec<&TensorData> = node
            .inputs
            .iter()
            .map(|a| values[a.index()].as_ref().expect("topological order: inputs are computed first"))
            .collect();
        let dims = node.shape.eval(&bindings)?;
        // Fail with a typed error, not an abort, when the host cannot hold the result.
        let numel = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).unwrap_or(usize::MAX);
        drop(crate::data::host_reserve(numel, || format!("`{}` at {} ({dims:?})", node.op.name(), node.loc))?);
        let out = eval_node(node, &args, dims, inputs, round_floats)?;
        values[i] = Some(out);
        for a in &node.inputs {
            if last_use[a.index()] == i && !graph.outputs.contains(a) {
                values[a.index()] = None;
            }
        }
    }
    Ok(graph.outputs.iter().map(|o| values[o.index()].clone().expect("outputs are never freed")).collect())
}

/// Every op the reference implements (all of them); docs/ops.md reads this.
pub fn supports(_op: &Op) -> bool {
    true
}

fn last_uses(graph: &Graph) -> Vec<usize> {
    let mut last = vec![0usize; graph.nodes.len()];
    for (i, n) in graph.nodes.iter().enumerate() {
        for a in &n.inputs {
            last[a.index()] = i;
        }
    }
    last
}

/// Binds each symbol that appears alone as an input dim to that input's actual size, and checks the rest.
pub(crate) fn bind_symbols(graph: &Graph, inputs: &[&TensorData]) -> Result<Bindings> {
    let shapes: Vec<(DType, &[usize])> = inputs.iter().map(|d| (d.dtype(), d.dims())).collect();
    bind_symbol_dims(graph, &shapes)
}

/// [`bind_symbols`] from each input's dtype and dims (device tensors have no host data to look at).
pub(crate) fn bind_symbol_dims(graph: &Graph, inputs: &[(DType, &[usize])]) -> Result<Bindings> {
    let mut b = Bindings::new();
    for (gi, &(dtype, dims)) in graph.inputs.iter().zip(inputs) {
        let node = graph.node(gi.node);
        if node.shape.rank() != dims.len() || node.dtype != dtype {
            return Err(Error::Runtime {
                op: "input".into(),
                msg: format!("expected {} {}, got {dtype} {dims:?}", node.dtype, node.shape),
                loc: node.loc.clone(),
            });
        }
        for (d, &actual) in node.shape.dims().iter().zip(dims) {
            let syms = d.symbols();
            if let (1, Some(&s)) = (syms.len(), syms.iter().next()) {
                if *d == Expr::sym(s) && b.get(s).is_none() {
                    b.bind(s, actual as i64);
                }
            }
        }
    }
    for (gi, &(_, dims)) in graph.inputs.iter().zip(inputs) {
        let node = graph.node(gi.node);
        if node.shape.eval(&b)? != dims {
            return Err(Error::Runtime {
                op: "input".into(),
                msg: format!("dims {dims:?} do not satisfy {}", node.shape),
                loc: node.loc.clone(),
            });
        }
    }
    Ok(b)
}

fn runtime(node: &Node, msg: impl Into<String>) -> Error {
    Error::Runtime { op: node.op.name().into(), msg: msg.into(), loc: node.loc.clone() }
}

fn eval_node(
    node: &Node,
    args: &[&TensorData],
    dims: Vec<usize>,
    inputs: &[&TensorData],
    round_floats: bool,
) -> Result<TensorData> {
    let dt = node.dtype;
    let numel: usize = dims.iter().product();
    let finish = |v: Vec<f64>, dims: Vec<usize>| {
        if dt.is_float() && !round_floats {
            return TensorData::from_rounded(v, dims, dt);
        }
        TensorData::from_rounded(v.into_iter().map(|x| dt.round(x)).collect(), dims, dt)
    };
    let out = match &node.op {
        Op::Input { index } => return Ok(inputs[*index].clone()),
        Op::Full { value } => vec![*value; numel],
        Op::Iota { axis } => map_index(&dims, |idx| idx[*axis] as f64),
        Op::Rand { stream } => {
            let Some(&[k0, k1]) = args.first().map(|a| a.values()) else {
                return Err(runtime(node, "the key is not a tensor of two elements"));
            };
            let key = crate::rng::key_of(k0, k1);
            (0..numel as u64).map(|i| crate::rng::uniform_in(i, *stream, key)).collect()
        }
        Op::Unary { op } => args[0].values().iter().map(|&x| unary(*op, x)).collect(),
        Op::Binary { op } => {
            let (a, b) = (args[0].values(), args[1].values());
            let int = args[0].dtype().is_int();
            let mut v = Vec::with_capacity(numel);
            for (&x, &y) in a.iter().zip(b) {
                v.push(binary(*op, x, y, int).ok_or_else(|| runtime(node, "integer division by zero"))?);
            }
            v
        }
        Op::Where => {
            let (c, a, b) = (args[0].values(), args[1].values(), args[2].values());
            c.iter().zip(a).zip(b).map(|((&c, &a), &b)| if c != 0.0 { a } else { b }).collect()
        }
        Op::Cast => args[0].values().to_vec(),
        Op::Reduce { op, axes, .. } => reduce(args[0], axes, *op),
        Op::ArgReduce { op, axis, .. } => arg_reduce(args[0], *axis, *op),
        Op::Reshape => args[0].values().to_vec(),
        Op::Permute { perm } => {
            let src = args[0];
            let st = concrete_strides(src.dims());
            map_index(&dims, |idx| src.values()[idx.iter().enumerate().map(|(i, &x)| x * st[perm[i]]).sum::<usize>()])
        }
        Op::Expand => {
            let src = args[0];
            let st = concrete_strides(src.dims());
            map_index(&dims, |idx| {
                let off: usize =
                    idx.iter().enumerate().map(|(i, &x)| if src.dims()[i] == 1 { 0 } else { x * st[i] }).sum();
                src.values()[off]
            })
        }
        Op::Slice { axis, start, step, .. } => {
            let src = args[0];
            let st = concrete_strides(src.dims());
            let start = start.eval(&Bindings::new()).map_err(|_| runtime(node, "symbolic slice start"))? as usize;
            map_index(&dims, |idx| {
                let off: usize = idx
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| if i == *axis { (start + x * step) * st[i] } else { x * st[i] })
                    .sum();
                src.values()[off]
            })
        }
        Op::Concat { axis } => concat(args, *axis, &dims),
        Op::Pad { pads, value } => {
            let src = args[0];
            let st = concrete_strides(src.dims());
            map_index(&dims, |idx| {
                let mut off = 0;
                for (i, &x) in idx.iter().enumerate() {
                    let (before, _) = pads[i];
                    if x < before || x - before >= src.dims()[i] {
                        return *value;
                    }
                    off += (x - before) * st[i];
                }
                src.values()[off]
            })
        }
        Op::IndexSelect { axis } | Op::Gather { axis } => {
            let (src, index) = (args[0], args[1]);
            let st = concrete_strides(src.dims());
            let ist = concrete_strides(index.dims());
            let gather = matches!(node.op, Op::Gather { .. });
            let mut v = Vec::with_capacity(numel);
            let mut bad = None;
            for_each_index(&dims, |idx| {
                let iflat = if gather { idx.iter().zip(&ist).map(|(x, s)| x * s).sum() } else { idx[*axis] };
                let j = index.values()[iflat];
                if j < 0.0 || j as usize >= src.dims()[*axis] {
                    bad.get_or_insert(j);
                    v.push(0.0);
                    return;
                }
                let off: usize =
                    idx.iter().enumerate().map(|(i, &x)| if i == *axis { j as usize } else { x } * st[i]).sum();
                v.push(src.values()[off]);
            });
            if let Some(j) = bad {
                return Err(runtime(
                    node,
                    format!("index {j} is out of range for a dim of size {}", src.dims()[*axis]),
                ));
            }
            v
        }
        Op::MatMul => matmul(args[0], args[1], &dims, false),
        Op::Attention { scale, causal } => {
            let sizes = attention_sizes(args[0], args[1], args[2]);
            crate::attention::reference(args[0].values(), args[1].values(), args[2].values(), sizes, *scale, *causal)
        }
        Op::AttentionLse { scale, causal } => {
            let [batch, tq, tk, d, _] = attention_sizes(args[0], args[1], args[1]);
            crate::attention_grad::lse_reference(
                args[0].values(),
                args[1].values(),
                [batch, tq, tk, d],
                *scale,
                *causal,
            )
        }
        Op::AttentionGrad { scale, causal, part } => {
            let sizes = attention_sizes(args[0], args[1], args[2]);
            let x = crate::attention_grad::GradOperands {
                q: args[0].values(),
                k: args[1].values(),
                v: args[2].values(),
                dout: args[3].values(),
                lse: args[4].values(),
                delta: args[5].values(),
            };
            crate::attention_grad::grad_reference(&x, sizes, *scale, *causal, *part)
        }
        Op::Softmax { axis } => lanes(args[0], *axis, |lane| {
            let m = lane.iter().cloned().fold(f64::NEG_INFINITY, nan_max);
            let e: Vec<f64> = lane.iter().map(|x| (x - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect()
        }),
        Op::LogSoftmax { axis } => lanes(args[0], *axis, |lane| {
            let m = lane.iter().cloned().fold(f64::NEG_INFINITY, nan_max);
            let lse = m + lane.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            lane.iter().map(|x| x - lse).collect()
        }),
        Op::LayerNorm { dims: k, eps, affine } => {
            let x = args[0];
            let group: usize = x.dims()[x.dims().len() - k..].iter().product();
            let mut v = Vec::with_capacity(numel);
            for chunk in x.values().chunks(group.max(1)) {
                let n = chunk.len() as f64;
                let mean = chunk.iter().sum::<f64>() / n;
                let var = chunk.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / n;
                let inv = 1.0 / (var + eps).sqrt();
                for (j, y) in chunk.iter().enumerate() {
                    let z = (y - mean) * inv;
                    v.push(if *affine { z * args[1].values()[j] + args[2].values()[j] } else { z });
                }
            }
            v
        }
        Op::Gelu { approx } => args[0].values().iter().map(|&x| gelu(x, *approx)).collect(),
        Op::Silu => args[0].values().iter().map(|&x| x / (1.0 + (-x).exp())).collect(),
        Op::Linear { bias } => {
            let out_features = args[1].dims()[0];
            let rows = numel.checked_div(out_features).unwrap_or(0);
            let mut y = matmul(args[0], args[1], &[rows, out_features], true);
            if *bias {
                let b = args[2].values();
                for (i, y) in y.iter_mut().enumerate() {
                    *y += b[i % b.len()];
                }
            }
            y
        }
        Op::Mean { axes, .. } => {
            let count: usize = axes.iter().map(|&a| args[0].dims()[a]).product();
            reduce(args[0], axes, ReduceOp::Sum).into_iter().map(|s| s / count as f64).collect()
        }
        Op::Var { axes, correction, .. } => variance(args[0], axes, *correction),
        Op::Conv { window, groups, bias } => {
            crate::conv::reference_conv(args[0], args[1], bias.then(|| args[2]), &dims, window, *groups)
        }
        Op::Unfold { kernel, window, value } => {
            crate::conv::reference_unfold(args[0].values(), args[0].dims(), &dims, kernel, window, *value)
        }
        Op::Pool { mode, kernel, window } => {
            let lowest = args[0].dtype().min_value();
            crate::conv::reference_pool(args[0].values(), lowest, args[0].dims(), &dims, *mode, kernel, window)
        }
        // The reference runs one process: a world of one, where the reduction is the value itself.
        Op::AllReduce { .. } => args[0].values().to_vec(),
        Op::CausalMask => {
            let r = dims.len();
            let src = args[0].values();
            let mut v = Vec::with_capacity(numel);
            for_each_index(&dims, |idx| {
                let flat = v.len();
                v.push(if idx[r - 1] > idx[r - 2] { f64::NEG_INFINITY } else { src[flat] });
            });
            v
        }
    };
    debug_assert_eq!(out.len(), numel, "{} produced the wrong element count", node.op.name());
    Ok(finish(out, dims))
}

pub(crate) fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

pub(crate) fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

pub(crate) fn unary(op: UnaryOp, x: f64) -> f64 {
    let b = |c: bool| if c { 1.0 } else { 0.0 };
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Erf => libm::erf(x),
        UnaryOp::Relu => {
            if x.is_nan() {
                x
            } else {
                x.max(0.0)
            }
        }
        UnaryOp::Reciprocal => 1.0 / x,
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Not => b(x == 0.0),
        UnaryOp::IsNan => b(x.is_nan()),
    }
}

/// `None` only for an integer division by zero.
pub(crate) fn binary(op: BinaryOp, x: f64, y: f64, int: bool) -> Option<f64> {
    let b = |c: bool| if c { 1.0 } else { 0.0 };
    Some(match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div if int => {
            if y == 0.0 {
                return None;
            }
            (x / y).floor()
        }
        BinaryOp::Div => x / y,
        BinaryOp::Pow => x.powf(y),
        BinaryOp::Max => nan_max(x, y),
        BinaryOp::Min => nan_min(x, y),
        BinaryOp::Eq => b(x == y),
        BinaryOp::Ne => b(x != y),
        BinaryOp::Lt => b(x < y),
        BinaryOp::Le => b(x <= y),
        BinaryOp::Gt => b(x > y),
        BinaryOp::Ge => b(x >= y),
        BinaryOp::And => b(x != 0.0 && y != 0.0),
        BinaryOp::Or => b(x != 0.0 || y != 0.0),
        // Integers are held exactly as f64 (i32 and u32; i64 and u64 within 2^53); i128 holds both
        // signed and unsigned 64-bit operands, and the result is rounded to the dtype after.
        BinaryOp::BitAnd => ((x as i128) & (y as i128)) as f64,
        BinaryOp::BitOr => ((x as i128) | (y as i128)) as f64,
        BinaryOp::BitXor => ((x as i128) ^ (y as i128)) as f64,
        // On the 64-bit pattern (as a device register holds it); the dtype's rounding then keeps its width.
        BinaryOp::Shl => ((x as i128 as u64).checked_shl(shift_amount(y)).unwrap_or(0) as i64) as f64,
        BinaryOp::Shr => ((x as i128) >> shift_amount(y).min(127)) as f64,
    })
}

/// A shift amount as the devices read it: unsigned (a negative one is huge), at most 64 (past any width).
fn shift_amount(y: f64) -> u32 {
    if (0.0..64.0).contains(&y) {
        y as u32
    } else {
        64
    }
}

fn gelu(x: f64, approx: GeluApprox) -> f64 {
    match approx {
        GeluApprox::Erf => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        GeluApprox::Tanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
    }
}

/// Calls `f` with every multi-index of `dims` in row-major order.
fn for_each_index(dims: &[usize], mut f: impl FnMut(&[usize])) {
    if dims.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; dims.len()];
    loop {
        f(&idx);
        let mut i = dims.len();
        loop {
            if i == 0 {
                return;
            }
            i -= 1;
            idx[i] += 1;
            if idx[i] < dims[i] {
                break;
            }
            idx[i] = 0;
        }
    }
}

fn map_index(dims: &[usize], mut f: impl FnMut(&[usize]) -> f64) -> Vec<f64> {
    let mut v = Vec::with_capacity(dims.iter().product());
    for_each_index(dims, |idx| v.push(f(idx)));
    v
}

/// For each input element, the flat index of its group once `axes` are dropped; and the group count.
fn groups(dims: &[usize], axes: &[usize]) -> (Vec<usize>, usize) {
    let kept: Vec<usize> = (0..dims.len()).filter(|a| !axes.contains(a)).collect();
    let kept_dims: Vec<usize> = kept.iter().map(|&a| dims[a]).collect();
    let kst = concrete_strides(&kept_dims);
    let mut g = Vec::with_capacity(dims.iter().product());
    for_each_index(dims, |idx| g.push(kept.iter().zip(&kst).map(|(&a, s)| idx[a] * s).sum()));
    (g, kept_dims.iter().product())
}

fn reduce(x: &TensorData, axes: &[usize], op: ReduceOp) -> Vec<f64> {
    let (g, n) = groups(x.dims(), axes);
    let init = match op {
        ReduceOp::Sum => 0.0,
        ReduceOp::Max => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
    };
    let mut acc = vec![init; n];
    for (&gi, &v) in g.iter().zip(x.values()) {
        acc[gi] = match op {
            ReduceOp::Sum => acc[gi] + v,
            ReduceOp::Max => nan_max(acc[gi], v),
            ReduceOp::Min => nan_min(acc[gi], v),
        };
    }
    acc
}

fn variance(x: &TensorData, axes: &[usize], correction: usize) -> Vec<f64> {
    let (g, n) = groups(x.dims(), axes);
    let count: usize = axes.iter().map(|&a| x.dims()[a]).product();
    let mut sum = vec![0.0; n];
    for (&gi, &v) in g.iter().zip(x.values()) {
        sum[gi] += v;
    }
    let mean: Vec<f64> = sum.iter().map(|s| s / count as f64).collect();
    let mut sq = vec![0.0; n];
    for (&gi, &v) in g.iter().zip(x.values()) {
        sq[gi] += (v - mean[gi]).powi(2);
    }
    let denom = count as f64 - correction as f64;
    sq.into_iter().map(|s| if denom > 0.0 { s / denom } else { f64::NAN }).collect()
}

fn arg_reduce(x: &TensorData, axis: usize, op: ArgReduceOp) -> Vec<f64> {
    lanes_reduce(x, axis, |lane| {
        let mut best = 0usize;
        for (i, &v) in lane.iter().enumerate() {
            let b = lane[best];
            if b.is_nan() {
                break;
            }
            let better = v.is_nan()
                || match op {
                    ArgReduceOp::ArgMax => v > b,
                    ArgReduceOp::ArgMin => v < b,
                };
            if better {
                best = i;
            }
        }
        best as f64
    })
}

/// (outer, len, inner) of a tensor viewed along `axis`.
fn split_at_axis(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (dims[..axis].iter().product(), dims[axis], dims[axis + 1..].iter().product())
}

/// Applies `f` to every lane along `axis`, writing the lane back in place.
fn lanes(x: &TensorData, axis: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    let (outer, len, inner) = split_at_axis(x.dims(), axis);
    let mut out = vec![0.0; x.numel()];
    let mut lane = vec![0.0; len];
    for o in 0..outer {
        for n in 0..inner {
            for (i, l) in lane.iter_mut().enumerate() {
                *l = x.values()[(o * len + i) * inner + n];
            }
            for (i, y) in f(&lane).into_iter().enumerate() {
                out[(o * len + i) * inner + n] = y;
            }
        }
    }
    out
}

/// Reduces every lane along `axis` to one value.
fn lanes_reduce(x: &TensorData, axis: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let (outer, len, inner) = split_at_axis(x.dims(), axis);
    let mut out = Vec::with_capacity(outer * inner);
    let mut lane = vec![0.0; len];
    for o in 0..outer {
        for n in 0..inner {
            for (i, l) in lane.iter_mut().enumerate() {
                *l = x.values()[(o * len + i) * inner + n];
            }
            out.push(f(&lane));
        }
    }
    out
}

fn concat(args: &[&TensorData], axis: usize, dims: &[usize]) -> Vec<f64> {
    let (outer, _, inner) = split_at_axis(dims, axis);
    let mut out = Vec::with_capacity(dims.iter().product());
    for o in 0..outer {
        for a in args {
            let chunk = a.dims()[axis] * inner;
            out.extend_from_slice(&a.values()[o * chunk..(o + 1) * chunk]);
        }
    }
    out
}

/// `[..., m, k] x [..., k, n]`, or with `b_transposed`, `[..., m, k] x [n, k]^T` (Linear's weight).
fn matmul(a: &TensorData, b: &TensorData, out_dims: &[usize], b_transposed: bool) -> Vec<f64> {
    let r = out_dims.len();
    let (m, n) = (out_dims[r - 2], out_dims[r - 1]);
    let k = a.dims()[a.dims().len() - 1];
    let batch: usize = out_dims[..r - 2].iter().product();
    let mut out = vec![0.0; batch * m * n];
    let (av, bv) = (a.values(), b.values());
    for bi in 0..batch {
        let ao = bi * m * k;
        let bo = if b_transposed { 0 } else { bi * k * n };
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for p in 0..k {
                    let bval = if b_transposed { bv[j * k + p] } else { bv[bo + p * n + j] };
                    s += av[ao + i * k + p] * bval;
                }
                out[(bi * m + i) * n + j] = s;
            }
        }
    }
    out
}

/// The dtype a reduction yields (PyTorch's rule: integer and bool sums widen to i64).
pub fn reduce_dtype(op: ReduceOp, input: DType) -> DType {
    match (op, input) {
        // numpy's rule for the wide unsigned: they stay unsigned (a u64 sum past 2^63 keeps its sign bit).
        (ReduceOp::Sum, DType::U32 | DType::U64) => DType::U64,
        (ReduceOp::Sum, d) if !d.is_float() => DType::I64,
        (_, d) => d,
    }
}

/// `[batch, tq, tk, d, dv]` of an attention over `q` `[.., tq, d]`, `k` `[.., tk, d]` and `v` `[.., tk, dv]`
/// (batch dims flattened).
fn attention_sizes(q: &TensorData, k: &TensorData, v: &TensorData) -> [usize; 5] {
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    let r = qd.len();
    [qd[..r - 2].iter().product(), qd[r - 2], kd[r - 2], qd[r - 1], vd[r - 1]]
}
