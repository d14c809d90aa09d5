//! Neural-network ONNX ops: matrix products, convolution and pooling (with ONNX's `auto_pad` and
//! `ceil_mode` rules turned into explicit padding), normalizations and softmax.

use super::{axis, invalid, one, product, reshape_to, unsupported, Node, OpResult};
use crate::value::Value;
use kiln_graph::sym::Expr;
use kiln_graph::{DType, Tensor, Window};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &[
    "MatMul",
    "Einsum",
    "Gemm",
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "BatchNormalization",
    "InstanceNormalization",
    "LayerNormalization",
    "GroupNormalization",
    "RMSNormalization",
    "LpNormalization",
    "LRN",
    "Softmax",
    "LogSoftmax",
    "Hardmax",
    "LpPool",
    "GlobalLpPool",
    "MeanVarianceNormalization",
];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    Some(match op {
        "MatMul" => (|| one(node.tensor(0)?.matmul(&node.tensor(1)?)?))(),
        "Einsum" => (|| {
            let Some(equation) = node.string("equation") else { return invalid("Einsum without an equation") };
            let operands = (0..node.args.len()).map(|i| node.tensor(i)).collect::<OpResult<Vec<_>>>()?;
            one(Tensor::einsum(&equation, &operands.iter().collect::<Vec<_>>())?)
        })(),
        "Gemm" => gemm(node),
        "Conv" => conv(node),
        "MaxPool" | "AveragePool" => pool(node, op == "MaxPool"),
        "GlobalAveragePool" | "GlobalMaxPool" => (|| {
            let x = node.tensor(0)?;
            let axes: Vec<isize> = (2..x.rank() as isize).collect();
            one(if op == "GlobalMaxPool" { x.max(&axes, true)? } else { x.mean(&axes, true)? })
        })(),
        "BatchNormalization" => batch_norm(node),
        "MeanVarianceNormalization" => (|| {
            // ONNX's definition: (x - E[x]) / (sqrt(E[x²] - E[x]²) + 1e-9) over `axes` (N, H, W by default).
            let x = node.tensor(0)?;
            let r = x.rank();
            let axes: Vec<isize> = match node.ints("axes") {
                Some(a) => a.iter().map(|&a| axis(a, r).map(|a| a as isize)).collect::<OpResult<_>>()?,
                None => vec![0, 2, 3],
            };
            let mean = x.mean(&axes, true)?;
            let var = x.mul(&x)?.mean(&axes, true)?.sub(&mean.mul(&mean)?)?;
            one(x.sub(&mean)?.div(&var.sqrt()?.add(1e-9)?)?)
        })(),
        "InstanceNormalization" => (|| {
            let (scale, bias) = (node.opt_tensor(1)?, node.opt_tensor(2)?);
            one(node.tensor(0)?.instance_norm(scale.as_ref(), bias.as_ref(), node.float("epsilon", 1e-5))?)
        })(),
        "LayerNormalization" => layer_norm(node),
        "GroupNormalization" => group_norm(node),
        "LRN" => lrn(node),
        "Softmax" | "LogSoftmax" => softmax(node, op == "LogSoftmax"),
        "ConvTranspose" => conv_transpose(node),
        "RMSNormalization" => (|| {
            let (x, scale) = (node.tensor(0)?, node.tensor(1)?);
            let r = x.rank();
            let a = axis(node.int("axis", -1), r)?;
            let axes: Vec<isize> = (a as isize..r as isize).collect();
            let xc = if x.dtype() == kiln_graph::DType::F32 { x.clone() } else { x.cast(kiln_graph::DType::F32)? };
            let inv = xc.mul(&xc)?.mean(&axes, true)?.add(node.float("epsilon", 1e-5))?.rsqrt()?;
            one(xc.mul(&inv)?.cast(x.dtype())?.mul(&scale)?)
        })(),
        "LpNormalization" => (|| {
            let x = node.tensor(0)?;
            let a = axis(node.int("axis", -1), x.rank())? as isize;
            let norm = match node.int("p", 2) {
                1 => x.abs()?.sum(&[a], true)?,
                2 => x.mul(&x)?.sum(&[a], true)?.sqrt()?,
                p => return invalid(format!("p = {p}")),
            };
            one(x.div(&norm)?)
        })(),
        "Hardmax" => hardmax(node),
        "LpPool" | "GlobalLpPool" => lp_pool(node, op == "GlobalLpPool"),
        _ => return None,
    })
}

/// `alpha * A' @ B' + beta * C`.
fn gemm(node: &Node) -> OpResult<Vec<Value>> {
    let (a, b, c) = (node.tensor(0)?, node.tensor(1)?, node.opt_tensor(2)?);
    let (alpha, beta) = (node.float("alpha", 1.0), node.float("beta", 1.0));
    let (ta, tb) = (node.int("transA", 0) != 0, node.int("transB", 0) != 0);
    let a = if ta { a.transpose(0, 1)? } else { a };
    // The common `x @ W^T + b` is kiln's linear, whose bias fuses into the matmul's epilogue.
    if tb
        && alpha == 1.0
        && beta == 1.0
        && c.as_ref().is_none_or(|c| c.rank() == 1 && c.shape().dims()[0] == b.shape().dims()[0])
    {
        return one(a.linear(&b, c.as_ref())?);
    }
    let b = if tb { b.transpose(0, 1)? } else { b };
    let mut y = a.matmul(&b)?;
    if alpha != 1.0 {
        y = y.mul(alpha)?;
    }
    if let Some(c) = c {
        y = y.add(&if beta == 1.0 { c } else { c.mul(beta)? })?;
    }
    one(y)
}

/// Spatial lengths of `x` as constants (`auto_pad` and `ceil_mode` need them).
fn spatial(x: &Tensor) -> OpResult<Vec<usize>> {
    match x.shape().as_concrete() {
        Some(d) if d.len() >= 3 => Ok(d[2..].to_vec()),
        Some(d) => invalid(format!("input of rank {} (needs [N, C, spatial...])", d.len())),
        None => x.shape().dims()[2..]
            .iter()
            .map(|d| d.as_const().map(|c| c as usize))
            .collect::<Option<Vec<_>>>()
            .map_or_else(|| unsupported("auto_pad or ceil_mode over symbolic spatial sizes"), Ok),
    }
}

/// The window of a conv/pool node: strides, dilations and explicit padding from `pads` or `auto_pad`.
fn window(node: &Node, x: &Tensor, kernel: &[usize]) -> OpResult<Window> {
    let r = kernel.len();
    let per_axis = |name: &str| -> OpResult<Vec<usize>> {
        match node.ints(name) {
            None => Ok(vec![1; r]),
            Some(v) if v.len() == r && v.iter().all(|&s| s >= 1) => Ok(v.iter().map(|&s| s as usize).collect()),
            Some(v) => invalid(format!("{name} {v:?} for {r} spatial axes")),
        }
    };
    let (stride, dilation) = (per_axis("strides")?, per_axis("dilations")?);
    let auto_pad = node.string("auto_pad").unwrap_or_else(|| "NOTSET".into());
    let padding = match auto_pad.as_str() {
        "NOTSET" => match node.ints("pads") {
            None => vec![(0, 0); r],
            Some(p) if p.len() == 2 * r && p.iter().all(|&v| v >= 0) => {
                (0..r).map(|a| (p[a] as usize, p[a + r] as usize)).collect()
            }
            Some(p) => return invalid(format!("pads {p:?} for {r} spatial axes")),
        },
        "VALID" => vec![(0, 0); r],
        "SAME_UPPER" | "SAME_LOWER" => {
            let lens = spatial(x)?;
            if lens.contains(&0)
                || (0..r).any(|a| dilation[a].checked_mul(kernel[a].saturating_sub(1)).is_none_or(|s| s > 1 << 30))
            {
                return invalid(format!("auto_pad over spatial sizes {lens:?} with kernel {kernel:?}"));
            }
            (0..r)
                .map(|a| {
                    let out = lens[a].div_ceil(stride[a]);
                    let span = dilation[a] * (kernel[a] - 1) + 1;
                    let total = ((out - 1) * stride[a] + span).saturating_sub(lens[a]);
                    let small = total / 2;
                    if auto_pad == "SAME_UPPER" {
                        (small, total - small)
                    } else {
                        (total - small, small)
                    }
                })
                .collect()
        }
        other => return invalid(format!("auto_pad {other:?}")),
    };
    Ok(Window { stride, padding, dilation })
}

/// A convolution weight's dims and its kernel (its trailing dims), which must be constant.
fn weight_dims(w: &Tensor) -> OpResult<(Vec<usize>, Vec<usize>)> {
    let dims = w.shape().as_concrete().ok_or(super::OpError::Unsupported("a weight of symbolic shape".into()))?;
    if dims.len() < 3 {
        return invalid(format!("weight of rank {}", dims.len()));
    }
    let kernel = dims[2..].to_vec();
    if kernel.contains(&0) {
        return invalid(format!("a weight with an empty kernel, {dims:?}"));
    }
    Ok((dims, kernel))
}

fn conv(node: &Node) -> OpResult<Vec<Value>> {
    let (x, w, b) = (node.tensor(0)?, node.tensor(1)?, node.opt_tensor(2)?);
    one(conv_of(node, &x, &w, b.as_ref())?)
}

/// `x` convolved with `w` (plus `b`) under the node's `Conv` attributes (`kernel_shape`, `strides`,
/// `pads`/`auto_pad`, `dilations`, `group`): `Conv`'s and the quantized convolutions'.
pub(super) fn conv_of(node: &Node, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> OpResult<Tensor> {
    let (ws, kernel) = weight_dims(w)?;
    if let Some(k) = node.ints("kernel_shape") {
        if k.iter().map(|&v| v as usize).ne(kernel.iter().copied()) {
            return invalid(format!("kernel_shape {k:?} but the weight is {ws:?}"));
        }
    }
    let win = window(node, x, &kernel)?;
    let groups = node.int("group", 1);
    if groups < 1 {
        return invalid(format!("group {groups}"));
    }
    Ok(x.conv(w, b, &win, groups as usize)?)
}

fn pool(node: &Node, max: bool) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let want_indices = max && node.proto.output.get(1).is_some_and(|o| !o.is_empty());
    let kernel: Vec<usize> = match node.ints("kernel_shape") {
        Some(k) if !k.is_empty() && k.iter().all(|&v| v >= 1) => k.iter().map(|&v| v as usize).collect(),
        k => return invalid(format!("kernel_shape {k:?}")),
    };
    let mut win = window(node, &x, &kernel)?;
    let count_pad = node.int("count_include_pad", 0) != 0;
    // The explicit padding, before `ceil_mode` adds to it.
    let given = win.padding.clone();
    let ceil = node.int("ceil_mode", 0) != 0;
    if ceil {
        // Rounding the output length up is extra padding at the end that no window counts: -inf for a
        // max, uncounted for an average. A last window starting past the input and its left padding is
        // dropped (PyTorch's rule, which ONNX's reference follows).
        let lens = spatial(&x)?;
        if lens.contains(&0)
            || kernel.iter().zip(&win.dilation).any(|(&k, &d)| d.checked_mul(k - 1).is_none_or(|s| s > 1 << 30))
        {
            return invalid(format!("ceil_mode over spatial sizes {lens:?} with kernel {kernel:?}"));
        }
        for a in 0..kernel.len() {
            let (pb, pa) = win.padding[a];
            let span = win.dilation[a] * (kernel[a] - 1) + 1;
            let room = (lens[a] + pb + pa).saturating_sub(span);
            let mut out = room.div_ceil(win.stride[a]) + 1;
            if (out - 1) * win.stride[a] >= lens[a] + pb {
                out -= 1;
            }
            let need = (out - 1) * win.stride[a] + span;
            win.padding[a].1 += need.saturating_sub(lens[a] + pb + pa);
        }
    }
    if !max && count_pad && ceil && win.padding != given {
        // Counting the given padding but not the rounding's: the window's sum over a divisor per output
        // position, its taps inside the input and the given padding (PyTorch's rule).
        let lens = spatial(&x)?;
        let sum = x.avg_pool(&kernel, &win, true)?.mul(kernel.iter().product::<usize>() as f64)?;
        let Some(out) = sum.shape().as_concrete() else { return unsupported("pooling over symbolic dims") };
        let out = &out[2..];
        let per_axis: Vec<Vec<f64>> = (0..kernel.len())
            .map(|a| {
                let limit = lens[a] + given[a].0 + given[a].1;
                (0..out[a])
                    .map(|o| (0..kernel[a]).filter(|&j| o * win.stride[a] + j * win.dilation[a] < limit).count() as f64)
                    .collect()
            })
            .collect();
        let total: usize = out.iter().product();
        let counts: Vec<f64> = (0..total)
            .map(|flat| {
                let (mut rest, mut c) = (flat, 1.0);
                for a in (0..out.len()).rev() {
                    c *= per_axis[a][rest % out[a]];
                    rest /= out[a];
                }
                c
            })
            .collect();
        let mut dims = vec![1, 1];
        dims.extend_from_slice(out);
        return one(sum.div(&node.model.constant(counts, &dims, x.dtype())?)?);
    }
    if want_indices {
        let y = x.max_pool(&kernel, &win)?;
        let indices = max_indices(node, &x, &y, &kernel, &win)?;
        return Ok(vec![Value::Tensor(y), Value::Tensor(indices)]);
    }
    one(if max { x.max_pool(&kernel, &win)? } else { x.avg_pool(&kernel, &win, count_pad)? })
}

/// The most taps a window may have for MaxPool's indices: each is a strided slice in the traced graph.
const MAX_INDEXED_TAPS: usize = 256;

/// The most (tap, window) entries of MaxPool's index table, made on the host.
const MAX_INDEX_TABLE: usize = 1 << 24;

/// MaxPool's second output: where each window's maximum is in `x`, as an index over all of `x`, its
/// planes in order and each plane row-major (column-major with `storage_order` 1); the first of equal
/// maxima. The taps are strided slices of `x` padded with -inf, stacked; their
/// argmax picks a tap, and a host-made table turns (tap, output position) into the input's index.
fn max_indices(node: &Node, x: &Tensor, y: &Tensor, kernel: &[usize], win: &Window) -> OpResult<Tensor> {
    let (Some(xd), Some(yd)) = (x.shape().as_concrete(), y.shape().as_concrete()) else {
        return unsupported("MaxPool's indices over symbolic dims");
    };
    let taps: usize = kernel.iter().product();
    if taps > MAX_INDEXED_TAPS {
        return unsupported(format!("MaxPool's indices over windows of {taps} taps (up to {MAX_INDEXED_TAPS})"));
    }
    let s = kernel.len();
    let (lens, out) = (&xd[2..], &yd[2..]);
    let mut pads = vec![(0, 0); 2];
    pads.extend(win.padding.iter().copied());
    // Padding no window's max is below: `-inf`, or an integer dtype's lowest value.
    let padded = x.pad(&pads, x.dtype().min_value())?;
    // Tap t's position in the window, row-major.
    let offsets = |t: usize| {
        let mut at = vec![0; s];
        let mut rest = t;
        for a in (0..s).rev() {
            at[a] = rest % kernel[a];
            rest /= kernel[a];
        }
        at
    };
    let mut stacked = Vec::with_capacity(taps);
    for t in 0..taps {
        let mut v = padded.clone();
        for (a, off) in offsets(t).into_iter().enumerate() {
            let start = off * win.dilation[a];
            let end = start + (out[a] - 1) * win.stride[a] + 1;
            v = v.slice(2 + a as isize, start as isize, Some(end as isize), win.stride[a])?;
        }
        stacked.push(v.unsqueeze(2)?);
    }
    let tap = Tensor::concat(&stacked.iter().collect::<Vec<_>>(), 2)?.argmax(2, true)?;
    // Each (tap, output position)'s index within its input plane.
    let positions: usize = out.iter().product();
    if taps.saturating_mul(positions) > MAX_INDEX_TABLE {
        return unsupported(format!(
            "MaxPool's indices for {positions} windows of {taps} taps (a host table past {MAX_INDEX_TABLE})"
        ));
    }
    let column_major = node.int("storage_order", 0) != 0;
    let mut table = Vec::with_capacity(taps * positions);
    for t in 0..taps {
        let off = offsets(t);
        for p in 0..positions {
            let (mut rest, mut flat) = (p, 0i64);
            let mut at = vec![0; s];
            for a in (0..s).rev() {
                at[a] = rest % out[a];
                rest /= out[a];
            }
            // Row-major within the plane, or column-major with `storage_order` 1.
            let axes: Vec<usize> = if column_major { (0..s).rev().collect() } else { (0..s).collect() };
            for a in axes {
                let i = (at[a] * win.stride[a] + off[a] * win.dilation[a]) as i64 - win.padding[a].0 as i64;
                flat = flat * lens[a] as i64 + i;
            }
            table.push(flat as f64);
        }
    }
    let mut tdims = vec![1, 1, taps];
    tdims.extend_from_slice(out);
    let full: Vec<isize> = [xd[0], xd[1], taps].iter().chain(out).map(|&d| d as isize).collect();
    let table = node.model.constant(table, &tdims, DType::I64)?.expand(&full)?;
    let within = table.gather(2, &tap.expand(&[&full[..2], &[1], &full[3..]].concat())?)?.squeeze(2)?;
    // Each plane's first index: (n · C + c) · its size.
    let plane: usize = lens.iter().product();
    let starts: Vec<f64> = (0..xd[0] * xd[1]).map(|i| (i * plane) as f64).collect();
    let mut sdims = vec![xd[0], xd[1]];
    sdims.extend(std::iter::repeat_n(1, s));
    Ok(within.add(&node.model.constant(starts, &sdims, DType::I64)?)?)
}

/// A per-channel parameter `[C]` shaped to broadcast over `[N, C, ...]` of rank `rank`.
fn per_channel(p: &Tensor, rank: usize) -> OpResult<Tensor> {
    let mut dims = vec![-1isize];
    dims.extend(std::iter::repeat_n(1, rank.saturating_sub(2)));
    Ok(p.reshape(&dims)?)
}

/// Inference: the given statistics. Training mode (opset 14 on): the batch's own mean and (biased)
/// variance over every axis but the channels, and the running statistics updated by `momentum` as
/// its second and third outputs.
fn batch_norm(node: &Node) -> OpResult<Vec<Value>> {
    let training = node.int("training_mode", 0) != 0;
    if !training && node.proto.output.iter().skip(1).any(|o| !o.is_empty()) {
        return unsupported("BatchNormalization's statistics outputs outside training mode (opsets before 14)");
    }
    let (x, scale, bias, mean, var) =
        (node.tensor(0)?, node.tensor(1)?, node.tensor(2)?, node.tensor(3)?, node.tensor(4)?);
    let eps = node.float("epsilon", 1e-5);
    if !training {
        return one(x.batch_norm(&mean, &var, Some(&scale), Some(&bias), eps)?);
    }
    let axes: Vec<isize> = (0..x.rank() as isize).filter(|&a| a != 1).collect();
    let batch_mean = x.mean(&axes, false)?;
    let batch_var = x.var(&axes, 0, false)?;
    let m = node.float("momentum", 0.9);
    let running = |given: &Tensor, batch: &Tensor| -> OpResult<Tensor> { Ok(given.mul(m)?.add(&batch.mul(1.0 - m)?)?) };
    Ok(vec![
        Value::Tensor(x.batch_norm(&batch_mean, &batch_var, Some(&scale), Some(&bias), eps)?),
        Value::Tensor(running(&mean, &batch_mean)?),
        Value::Tensor(running(&var, &batch_var)?),
    ])
}

fn layer_norm(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let r = x.rank();
    let a = axis(node.int("axis", -1), r)?;
    let eps = node.float("epsilon", 1e-5);
    let (scale, bias) = (node.tensor(1)?, node.opt_tensor(2)?);
    let norm = &x.shape().dims()[a..].to_vec();
    let stats_wanted = node.proto.output.iter().skip(1).any(|o| !o.is_empty());
    let exact =
        scale.shape().dims() == norm.as_slice() && bias.as_ref().is_none_or(|b| b.shape().dims() == norm.as_slice());
    if exact && !stats_wanted && bias.is_some() {
        return one(x.layer_norm(r - a, Some(&scale), bias.as_ref(), eps)?);
    }
    let half = !matches!(x.dtype(), kiln_graph::DType::F32);
    let xc = if half && node.int("stash_type", 1) == 1 { x.cast(kiln_graph::DType::F32)? } else { x.clone() };
    let axes: Vec<isize> = (a as isize..r as isize).collect();
    let mean = xc.mean(&axes, true)?;
    let d = xc.sub(&mean)?;
    let inv = d.mul(&d)?.mean(&axes, true)?.add(eps)?.rsqrt()?;
    let mut y = d.mul(&inv)?.cast(x.dtype())?.mul(&scale)?;
    if let Some(b) = bias {
        y = y.add(&b)?;
    }
    Ok(vec![Value::Tensor(y), Value::Tensor(mean), Value::Tensor(inv)])
}

fn group_norm(node: &Node) -> OpResult<Vec<Value>> {
    let (x, scale, bias) = (node.tensor(0)?, node.tensor(1)?, node.tensor(2)?);
    let groups = node.int("num_groups", 0);
    let c = x.shape().dims().get(1).and_then(Expr::as_const);
    let (Some(c), true) = (c, groups >= 1) else {
        return invalid("needs [N, C, ...] with a constant C and num_groups >= 1");
    };
    let eps = node.float("epsilon", 1e-5);
    let per_group = scale.shape().dims().first().and_then(Expr::as_const) == Some(groups) && groups != c;
    if per_group && c % groups == 0 {
        // Opset 18: one scale and bias per group, repeated over its channels.
        let spread = |p: &Tensor| -> OpResult<Tensor> {
            Ok(p.reshape(&[groups as isize, 1])?
                .expand(&[groups as isize, (c / groups) as isize])?
                .reshape(&[c as isize])?)
        };
        return one(x.group_norm(groups as usize, Some(&spread(&scale)?), Some(&spread(&bias)?), eps)?);
    }
    one(x.group_norm(groups as usize, Some(&scale), Some(&bias), eps)?)
}

/// Local response normalization across channels: the squared sum over a window of `size` channels is
/// an average pool over a `[N, 1, C, rest]` view.
fn lrn(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let size = node.int("size", 0);
    if size < 1 {
        return invalid(format!("size {size}"));
    }
    let size = size as usize;
    let (alpha, beta, bias) = (node.float("alpha", 1e-4), node.float("beta", 0.75), node.float("bias", 1.0));
    let dims = x.shape().dims().to_vec();
    if dims.len() < 3 {
        return invalid("needs [N, C, spatial...]");
    }
    let rest = product(&dims[2..])?;
    let view = reshape_to(&x, &[dims[0].clone(), Expr::constant(1), dims[1].clone(), rest])?;
    let sq = view.mul(&view)?;
    let win = Window { padding: vec![((size - 1) / 2, size / 2), (0, 0)], ..Window::default() };
    let mean = sq.avg_pool(&[size, 1], &win, true)?;
    let denom = mean.mul(alpha)?.add(bias)?.pow(beta)?;
    one(x.div(&reshape_to(&denom, &dims)?)?)
}

fn softmax(node: &Node, log: bool) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let r = x.rank();
    let f = |t: &Tensor, a: isize| if log { t.log_softmax(a) } else { t.softmax(a) };
    if node.opset() >= 13 {
        return one(f(&x, axis(node.int("axis", -1), r)? as isize)?);
    }
    // Before opset 13: the input is viewed as 2-D at `axis` and normalised over the second factor.
    let a = axis(node.int("axis", 1), r)?;
    if a + 1 == r {
        return one(f(&x, -1)?);
    }
    let dims = x.shape().dims().to_vec();
    let lead = product(&dims[..a])?;
    let tail = product(&dims[a..])?;
    let flat = reshape_to(&x, &[lead, tail])?;
    one(reshape_to(&f(&flat, -1)?, &dims)?)
}

/// The one-hot of the first maximum along an axis (before opset 13: of the input viewed as 2-D at it).
fn hardmax(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let r = x.rank();
    let dims = x.shape().dims().to_vec();
    let (view, a) = if node.opset() >= 13 {
        (x.clone(), axis(node.int("axis", -1), r)?)
    } else {
        let a = axis(node.int("axis", 1), r)?;
        let lead = product(&dims[..a])?;
        let tail = product(&dims[a..])?;
        (reshape_to(&x, &[lead, tail])?, 1)
    };
    let n =
        view.shape().dims()[a].as_const().ok_or(super::OpError::Unsupported("Hardmax over a symbolic axis".into()))?;
    let at = view.argmax(a as isize, true)?;
    let mut shape = vec![1isize; view.rank()];
    shape[a] = n as isize;
    let iota = Tensor::arange(0.0, n as f64, 1.0, kiln_graph::DType::I64)?.reshape(&shape)?;
    let hot = iota.eq(&at)?.where_(1.0, 0.0)?.cast(x.dtype())?;
    one(reshape_to(&hot, &dims)?)
}

/// ONNX's ConvTranspose: `pads` or `output_shape`/`auto_pad` (which fix the padding) on kiln's
/// transposed convolution.
fn conv_transpose(node: &Node) -> OpResult<Vec<Value>> {
    let (x, w, b) = (node.tensor(0)?, node.tensor(1)?, node.opt_tensor(2)?);
    let (_, kernel) = weight_dims(&w)?;
    let r = kernel.len();
    let per_axis = |name: &str, default: usize| -> OpResult<Vec<usize>> {
        match node.ints(name) {
            None => Ok(vec![default; r]),
            Some(v) if v.len() == r && v.iter().all(|&s| s >= 0) => Ok(v.iter().map(|&s| s as usize).collect()),
            Some(v) => invalid(format!("{name} {v:?} for {r} spatial axes")),
        }
    };
    let (stride, dilation, out_pad) =
        (per_axis("strides", 1)?, per_axis("dilations", 1)?, per_axis("output_padding", 0)?);
    let auto_pad = node.string("auto_pad").unwrap_or_else(|| "NOTSET".into());
    let output_shape = node.ints("output_shape");
    // ONNX pads may come out negative (an `output_shape` larger than the natural one): the transposed
    // convolution's full output already holds every contribution, so what lies beyond it is zeros (then
    // the bias). Output padding is folded into the end padding the same way.
    let pads: Vec<(i64, i64)> = if output_shape.is_some() || auto_pad.starts_with("SAME") {
        let lens = spatial(&x)?;
        if lens.contains(&0) || (0..r).any(|a| stride[a] > 1 << 16 || dilation[a] > 1 << 16) {
            return invalid(format!("output_shape or auto_pad over spatial sizes {lens:?}"));
        }
        let want: Vec<usize> = match &output_shape {
            Some(o) => o.iter().rev().take(r).rev().map(|&v| v.max(0) as usize).collect(),
            None => (0..r).map(|a| lens[a] * stride[a]).collect(),
        };
        (0..r)
            .map(|a| {
                let natural = stride[a] * (lens[a] - 1) + out_pad[a] + (kernel[a] - 1) * dilation[a] + 1;
                let total = natural as i64 - want[a] as i64;
                let half = total.div_euclid(2);
                let (b, e) = if auto_pad == "SAME_UPPER" { (half, total - half) } else { (total - half, half) };
                (b, e - out_pad[a] as i64)
            })
            .collect()
    } else {
        match node.ints("pads") {
            None => (0..r).map(|a| (0, -(out_pad[a] as i64))).collect(),
            Some(p) if p.len() == 2 * r && p.iter().all(|&v| v >= 0) => {
                (0..r).map(|a| (p[a], p[a + r] - out_pad[a] as i64)).collect()
            }
            Some(p) => return invalid(format!("pads {p:?}")),
        }
    };
    let padding: Vec<(usize, usize)> = pads.iter().map(|&(b, e)| (b.max(0) as usize, e.max(0) as usize)).collect();
    let grow: Vec<(usize, usize)> = pads.iter().map(|&(b, e)| ((-b).max(0) as usize, (-e).max(0) as usize)).collect();
    let groups = node.int("group", 1).max(1) as usize;
    let win = Window { stride, padding, dilation };
    let mut y = x.conv_transpose(&w, None, &win, &[], groups)?;
    if grow.iter().any(|&(b, e)| b + e > 0) {
        let mut all = vec![(0, 0); 2];
        all.extend(grow);
        y = y.pad(&all, 0.0)?;
    }
    if let Some(b) = b {
        let r = y.rank();
        y = y.add(&per_channel(&b, r)?)?;
    }
    one(y)
}

/// `(sum over the window of |x|^p)^(1/p)`: a padding-counting average pool times the window size.
fn lp_pool(node: &Node, global: bool) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let p = node.int("p", 2) as f64;
    if p <= 0.0 {
        return invalid(format!("p = {p}"));
    }
    let xp = x.abs()?.pow(p)?;
    let summed = if global {
        let axes: Vec<isize> = (2..x.rank() as isize).collect();
        xp.sum(&axes, true)?
    } else {
        let kernel: Vec<usize> = match node.ints("kernel_shape") {
            Some(k) if !k.is_empty() && k.iter().all(|&v| v >= 1) => k.iter().map(|&v| v as usize).collect(),
            k => return invalid(format!("kernel_shape {k:?}")),
        };
        if node.int("ceil_mode", 0) != 0 {
            return unsupported("LpPool with ceil_mode");
        }
        let win = window(node, &x, &kernel)?;
        let taps: usize = kernel.iter().product();
        xp.avg_pool(&kernel, &win, true)?.mul(taps as f64)?
    };
    one(summed.pow(1.0 / p)?)
}
