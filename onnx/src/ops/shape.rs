//! Layout, shape-arithmetic and reduction ONNX ops. Shapes are folded on the host as symbolic sizes
//! ([`Ints`]) wherever ONNX computes them with ops (`Shape`, `Gather`, `Concat`, `Unsqueeze`, ...), so a
//! model exported with a dynamic batch reshapes by expressions over kiln's symbols, not by data.

use super::{axis, invalid, one, product, reshape_to, unsupported, Node, OpError, OpResult};
use crate::tensor::to_data;
use crate::value::{Ints, Value};
use kiln_graph::layers::PadMode;
use kiln_graph::sym::Expr;
use kiln_graph::{DType, Tensor};

/// The op types this family converts.
pub(super) const OPS: &[&str] = &[
    "Compress",
    "Shape",
    "Size",
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "GatherElements",
    "Expand",
    "Tile",
    "Pad",
    "ConstantOfShape",
    "Range",
    "Trilu",
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ArgMax",
    "ArgMin",
    "ReduceProd",
    "DepthToSpace",
    "SpaceToDepth",
    "EyeLike",
    "OneHot",
    "CumSum",
    "CenterCropPad",
    "GatherND",
    "BlackmanWindow",
    "HammingWindow",
    "HannWindow",
];

/// The family; `None` when `op` is not one of it.
pub(super) fn run(node: &Node, op: &str) -> Option<OpResult<Vec<Value>>> {
    Some(match op {
        "Shape" => shape(node),
        "Size" => (|| {
            let dims = dims_of(node, 0)?;
            let n = product(&dims)?;
            Ok(vec![Value::Ints(Ints { dims: vec![], dtype: DType::I64, values: vec![n] })])
        })(),
        "Reshape" => reshape(node),
        "Flatten" => (|| {
            let x = node.tensor(0)?;
            let dims = x.shape().dims().to_vec();
            let a = if node.int("axis", 1) == dims.len() as i64 {
                dims.len()
            } else {
                axis(node.int("axis", 1), dims.len())?
            };
            one(reshape_to(&x, &[product(&dims[..a])?, product(&dims[a..])?])?)
        })(),
        "Transpose" => (|| {
            let x = node.tensor(0)?;
            let perm: Vec<isize> = match node.ints("perm") {
                Some(p) => p.iter().map(|&v| v as isize).collect(),
                None => (0..x.rank() as isize).rev().collect(),
            };
            one(x.permute(&perm)?)
        })(),
        "Squeeze" | "Unsqueeze" => squeeze(node, op == "Unsqueeze"),
        "Concat" => concat(node),
        "Split" => split(node),
        "Slice" => slice(node),
        "Gather" => gather(node),
        "GatherElements" => (|| {
            let (x, idx) = (node.tensor(0)?, node.tensor(1)?);
            let a = axis(node.int("axis", 0), x.rank())?;
            let idx = wrap_negative(&idx, &x.shape().dims()[a])?;
            one(x.gather(a as isize, &idx)?)
        })(),
        "Expand" => expand(node),
        "Tile" => tile(node),
        "Pad" => pad(node),
        "ConstantOfShape" => (|| {
            let dims = node.const_ints(0, "shape")?.unwrap_or_default();
            let dims: Vec<usize> = dims.iter().map(|&d| d.max(0) as usize).collect();
            let (value, dtype) =
                match node.proto.attribute.iter().find(|a| a.name() == "value").and_then(|a| a.t.as_ref()) {
                    Some(t) => {
                        let d = to_data(t, None).map_err(OpError::Unsupported)?;
                        (d.values().first().copied().unwrap_or(0.0), d.dtype())
                    }
                    None => (0.0, DType::F32),
                };
            if dtype.is_int() && dims.iter().product::<usize>() <= 4096 {
                let values = vec![Expr::constant(value as i64); dims.iter().product()];
                return Ok(vec![Value::Ints(Ints { dims, dtype, values })]);
            }
            one(Tensor::full(value, &dims, dtype)?)
        })(),
        "Range" => range(node),
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2"
        | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => reduce(node, op),
        "ArgMax" | "ArgMin" => arg_extreme(node, op == "ArgMax"),
        "Trilu" => trilu(node),
        "Compress" => compress(node),
        "DepthToSpace" | "SpaceToDepth" => depth_space(node, op == "DepthToSpace"),
        "EyeLike" => eye_like(node),
        "OneHot" => one_hot(node),
        "CumSum" => cumsum(node),
        "CenterCropPad" => center_crop_pad(node),
        "GatherND" => gather_nd(node),
        "BlackmanWindow" | "HammingWindow" | "HannWindow" => window(node, op),
        _ => return None,
    })
}

/// `ArgMax` / `ArgMin`: the first extreme along the axis, or with `select_last_index` the last — the
/// first of the axis reversed, counted back from its end (kiln's argmax keeps the first of ties).
fn arg_extreme(node: &Node, max: bool) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let a = axis(node.int("axis", 0), x.rank())?;
    let keep = node.int("keepdims", 1) != 0;
    let pick = |t: &Tensor| if max { t.argmax(a as isize, keep) } else { t.argmin(a as isize, keep) };
    if node.int("select_last_index", 0) == 0 {
        return one(pick(&x)?);
    }
    let Some(n) = x.shape().dims()[a].as_const().filter(|&n| n > 0) else {
        return unsupported("select_last_index = 1 over an axis of unknown or no length");
    };
    let reversed = x.index_select(a as isize, &Tensor::arange((n - 1) as f64, -1.0, -1.0, DType::I64)?)?;
    one(Tensor::full((n - 1) as f64, &[], DType::I64)?.sub(&pick(&reversed)?)?)
}

/// `Compress`: the slices along `axis` (of the flattened input without one) whose `condition` entry is
/// true. Which slices, and so the output's shape, depends on the condition's values: they are read on
/// the host (a graph break under `compile`, as a boolean mask's indexing is for torch.compile), and the
/// slices picked by one gather.
fn compress(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let Some(keep) = node.host_values(1)? else { return invalid("input 1 (condition) is required") };
    let (x, a) = match node.proto.attribute.iter().any(|p| p.name() == "axis") {
        true => {
            let a = axis(node.int("axis", 0), x.rank())?;
            (x, a)
        }
        false => (x.reshape(&[-1])?, 0),
    };
    let len = x.shape().dims()[a].as_const().ok_or(OpError::Unsupported("Compress along a symbolic axis".into()))?;
    if keep.len() > len as usize {
        return invalid(format!("a condition of {} entries for an axis of {len}", keep.len()));
    }
    let picked: Vec<f64> = keep.iter().enumerate().filter(|(_, &c)| c != 0.0).map(|(i, _)| i as f64).collect();
    let n = picked.len();
    one(x.index_select(a as isize, &node.model.constant(picked, &[n], DType::I64)?)?)
}

/// Input `i`'s dims as expressions (of a tensor or of folded integers).
fn dims_of(node: &Node, i: usize) -> OpResult<Vec<Expr>> {
    match node.value(i) {
        Some(Value::Tensor(t)) => Ok(t.shape().dims().to_vec()),
        Some(Value::Ints(v)) => Ok(v.dims.iter().map(|&d| Expr::constant(d as i64)).collect()),
        None => invalid(format!("input {i} is required")),
    }
}

fn shape(node: &Node) -> OpResult<Vec<Value>> {
    let dims = dims_of(node, 0)?;
    let r = dims.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(node.int("start", 0));
    let end = clamp(node.int("end", r));
    let values = if start < end { dims[start..end].to_vec() } else { vec![] };
    Ok(vec![Value::Ints(Ints::vector(values))])
}

fn reshape(node: &Node) -> OpResult<Vec<Value>> {
    let target: Vec<Expr> = if node.opset() < 5 {
        node.ints("shape").unwrap_or_default().into_iter().map(Expr::constant).collect()
    } else {
        match node.known_ints(1, "target shape")? {
            Some(v) => v.values,
            None => return invalid("input 1 (shape) is required"),
        }
    };
    let dims = dims_of(node, 0)?;
    let allow_zero = node.int("allowzero", 0) != 0;
    let mut out = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, t) in target.iter().enumerate() {
        match t.as_const() {
            Some(0) if !allow_zero => out.push(
                dims.get(i)
                    .cloned()
                    .ok_or(OpError::Invalid(format!("shape entry {i} copies a dim the input lacks")))?,
            ),
            Some(-1) if infer.is_none() => {
                infer = Some(i);
                out.push(Expr::constant(1));
            }
            Some(c) if c < 0 => return invalid(format!("shape {target:?}")),
            _ => out.push(t.clone()),
        }
    }
    let numel = product(&dims)?;
    if let Some(i) = infer {
        let known = product(&out)?;
        if known.as_const() == Some(0) {
            return invalid("a -1 next to a zero size");
        }
        out[i] = numel.checked_floor_div(&known).map_err(|e| OpError::Invalid(e.to_string()))?;
    }
    if let Some(Value::Ints(v)) = node.value(0) {
        let dims: Option<Vec<usize>> = out.iter().map(|d| d.as_const().map(|c| c as usize)).collect();
        if let Some(dims) = dims.filter(|d| d.iter().product::<usize>() == v.values.len()) {
            return Ok(vec![Value::Ints(Ints { dims, ..v.clone() })]);
        }
    }
    one(reshape_to(&node.tensor(0)?, &out)?)
}

fn axes_of(node: &Node, input: usize, from_opset: i64) -> OpResult<Option<Vec<i64>>> {
    if node.opset() >= from_opset {
        node.const_ints(input, "list of axes")
    } else {
        Ok(node.ints("axes"))
    }
}

fn squeeze(node: &Node, unsqueeze: bool) -> OpResult<Vec<Value>> {
    let axes = axes_of(node, 1, 13)?;
    let dims = dims_of(node, 0)?;
    let rank = dims.len();
    // The axes inserted (ascending) or removed (descending), for folded integers and tensors alike.
    let mut pos: Vec<usize> = match (unsqueeze, axes) {
        (true, None) => return invalid("axes are required"),
        (true, Some(a)) => {
            let out = rank + a.len();
            a.iter().map(|&x| axis(x, out)).collect::<OpResult<_>>()?
        }
        (false, Some(a)) => a.iter().map(|&a| axis(a, rank)).collect::<OpResult<_>>()?,
        (false, None) => (0..rank).filter(|&i| dims[i].as_const() == Some(1)).collect(),
    };
    pos.sort_unstable();
    if pos.windows(2).any(|w| w[0] == w[1]) {
        return invalid(format!("repeated axes {pos:?}"));
    }
    if !unsqueeze {
        if let Some(&p) = pos.iter().find(|&&p| dims[p].as_const() != Some(1)) {
            return invalid(format!("squeezing axis {p} of size {}", dims[p]));
        }
        pos.reverse();
    }
    if let Some(Value::Ints(v)) = node.value(0) {
        let mut d = v.dims.clone();
        for &p in &pos {
            if unsqueeze {
                d.insert(p.min(d.len()), 1);
            } else {
                d.remove(p);
            }
        }
        return Ok(vec![Value::Ints(Ints { dims: d, ..v.clone() })]);
    }
    let mut x = node.tensor(0)?;
    for p in pos {
        x = if unsqueeze { x.unsqueeze(p as isize)? } else { x.squeeze(p as isize)? };
    }
    one(x)
}

fn concat(node: &Node) -> OpResult<Vec<Value>> {
    let ints: Option<Vec<&Ints>> = node
        .args
        .iter()
        .map(|a| match a {
            Some(Value::Ints(v)) if v.dims.len() == 1 => Some(v),
            _ => None,
        })
        .collect();
    if let Some(parts) = ints.filter(|p| !p.is_empty()) {
        let values: Vec<Expr> = parts.iter().flat_map(|p| p.values.iter().cloned()).collect();
        return Ok(vec![Value::Ints(Ints { dims: vec![values.len()], dtype: parts[0].dtype, values })]);
    }
    let ts: Vec<Tensor> = (0..node.args.len()).map(|i| node.tensor(i)).collect::<OpResult<_>>()?;
    let rank = ts.first().map_or(0, Tensor::rank);
    let a = axis(node.int("axis", 0), rank)?;
    let refs: Vec<&Tensor> = ts.iter().collect();
    one(Tensor::concat(&refs, a as isize)?)
}

fn split(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let a = axis(node.int("axis", 0), x.rank())?;
    let len = x.shape().dims()[a].as_const().ok_or(OpError::Unsupported("splitting a symbolic axis".into()))? as usize;
    let outs = node.proto.output.len();
    let sizes: Vec<usize> = match if node.opset() >= 13 { node.const_ints(1, "split")? } else { node.ints("split") } {
        Some(s) => s.iter().map(|&v| v.max(0) as usize).collect(),
        None => {
            let n = if node.opset() >= 18 { node.int("num_outputs", outs as i64) as usize } else { outs };
            if n == 0 {
                return invalid("no outputs");
            }
            let chunk = len.div_ceil(n);
            (0..n).map(|i| chunk.min(len.saturating_sub(i * chunk))).collect()
        }
    };
    if sizes.iter().sum::<usize>() != len {
        return invalid(format!("split {sizes:?} of a dim of {len}"));
    }
    let mut start = 0;
    sizes
        .iter()
        .map(|&n| {
            let t = x.narrow(a as isize, start, n)?;
            start += n;
            Ok(Value::Tensor(t))
        })
        .collect()
}

fn slice(node: &Node) -> OpResult<Vec<Value>> {
    let (starts, ends, axes, steps) = if node.opset() < 10 {
        (node.ints("starts").unwrap_or_default(), node.ints("ends").unwrap_or_default(), node.ints("axes"), None)
    } else {
        (
            node.const_ints(1, "slice start")?.unwrap_or_default(),
            node.const_ints(2, "slice end")?.unwrap_or_default(),
            node.const_ints(3, "list of axes")?,
            node.const_ints(4, "slice step")?,
        )
    };
    let rank = dims_of(node, 0)?.len();
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| axis(a, rank)).collect::<OpResult<_>>()?,
        None => (0..starts.len()).collect(),
    };
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if starts.len() != ends.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return invalid("starts, ends, axes and steps differ in length");
    }
    if steps.contains(&0) {
        return invalid("a slice with a zero step");
    }
    if steps.iter().any(|&s| s < 0) {
        return backward_slice(node, &starts, &ends, &axes, &steps);
    }
    let big = |v: i64| v.clamp(isize::MIN as i64 / 2, isize::MAX as i64 / 2) as isize;
    if let (Some(Value::Ints(v)), true) = (node.value(0), rank == 1 && starts.len() == 1) {
        let n = v.values.len() as i64;
        let clamp = |i: i64| (if i < 0 { i + n } else { i }).clamp(0, n) as usize;
        let (b, e, s) = (clamp(starts[0]), clamp(ends[0]), steps[0] as usize);
        let values: Vec<Expr> = if e > b { v.values[b..e].iter().step_by(s).cloned().collect() } else { vec![] };
        return Ok(vec![Value::Ints(Ints { dims: vec![values.len()], dtype: v.dtype, values })]);
    }
    let mut x = node.tensor(0)?;
    for i in 0..starts.len() {
        x = x.slice(axes[i] as isize, big(starts[i]), Some(big(ends[i])), steps[i] as usize)?;
    }
    one(x)
}

/// The positions a slice from `start` to `end` (exclusive) by `step` takes along an axis of `n`, as
/// ONNX clamps them (a negative start or end counts from the end; a negative step walks down from
/// `start`, clamped to the last position, to `end`, clamped to one before the first).
fn slice_positions(start: i64, end: i64, step: i64, n: i64) -> Vec<i64> {
    let wrap = |i: i64| if i < 0 { i.saturating_add(n) } else { i };
    let (mut i, end) = if step > 0 {
        (wrap(start).clamp(0, n), wrap(end).clamp(0, n))
    } else {
        (wrap(start).clamp(0, n - 1), wrap(end).clamp(-1, n - 1))
    };
    let mut v = Vec::new();
    while (step > 0 && i < end) || (step < 0 && i > end) {
        v.push(i);
        i += step;
    }
    v
}

/// A slice with a negative step on some axis: each axis's positions (`slice_positions`) picked by one
/// gather, so the axes must have known lengths.
fn backward_slice(node: &Node, starts: &[i64], ends: &[i64], axes: &[usize], steps: &[i64]) -> OpResult<Vec<Value>> {
    let mut x = node.tensor(0)?;
    for i in 0..starts.len() {
        let Some(n) = x.shape().dims()[axes[i]].as_const() else {
            return unsupported("a slice with a negative step along a symbolic axis");
        };
        let picked: Vec<f64> = slice_positions(starts[i], ends[i], steps[i], n).into_iter().map(|p| p as f64).collect();
        let count = picked.len();
        x = x.index_select(axes[i] as isize, &node.model.constant(picked, &[count], DType::I64)?)?;
    }
    one(x)
}

/// `idx + len` where `idx` is negative (ONNX indices may count from the end). Along a symbolic axis the
/// wrap would need the size as data: refused rather than let a negative index through.
pub(super) fn wrap_negative(idx: &Tensor, len: &Expr) -> OpResult<Tensor> {
    let Some(len) = len.as_const() else {
        return unsupported("indices that may be negative along a symbolic axis");
    };
    Ok(idx.lt(0.0)?.where_(idx.add(len as f64)?, idx)?)
}

fn gather(node: &Node) -> OpResult<Vec<Value>> {
    let rank = dims_of(node, 0)?.len();
    let a = axis(node.int("axis", 0), rank)?;
    if let (Some(Value::Ints(data)), Some(Value::Ints(idx))) = (node.value(0), node.value(1)) {
        if let (1, Some(ix)) = (data.dims.len(), idx.consts()) {
            let n = data.values.len() as i64;
            let picked: Option<Vec<Expr>> = ix
                .iter()
                .map(|&i| {
                    let i = if i < 0 { i + n } else { i };
                    (0..n).contains(&i).then(|| data.values[i as usize].clone())
                })
                .collect();
            let values = picked.ok_or(OpError::Invalid(format!("indices {ix:?} out of range for {n} elements")))?;
            return Ok(vec![Value::Ints(Ints { dims: idx.dims.clone(), dtype: data.dtype, values })]);
        }
    }
    let (x, idx) = (node.tensor(0)?, node.tensor(1)?);
    let xd = x.shape().dims().to_vec();
    let idx = wrap_negative(&idx, &xd[a])?;
    let id = idx.shape().dims().to_vec();
    let flat = if id.len() == 1 { idx } else { reshape_to(&idx, &[product(&id)?])? };
    let picked = x.index_select(a as isize, &flat)?;
    let mut out = xd[..a].to_vec();
    out.extend(id.iter().cloned());
    out.extend(xd[a + 1..].iter().cloned());
    one(reshape_to(&picked, &out)?)
}

fn expand(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let target =
        node.known_ints(1, "target shape")?.ok_or(OpError::Invalid("input 1 (shape) is required".into()))?.values;
    let xd = x.shape().dims().to_vec();
    let rank = xd.len().max(target.len());
    let one_ = Expr::constant(1);
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let d = (i + xd.len()).checked_sub(rank).map_or(one_.clone(), |j| xd[j].clone());
        let t = (i + target.len()).checked_sub(rank).map_or(one_.clone(), |j| target[j].clone());
        out.push(if t == one_ { d } else { t });
    }
    // Dims that keep the input's size are -1, so a symbolic one need not be known as a number.
    let dims: Vec<isize> = out
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let same = (i + xd.len()).checked_sub(rank).is_some_and(|j| xd[j] == *d);
            match (same, d.as_const()) {
                (true, _) => Ok(-1),
                (false, Some(c)) => Ok(c as isize),
                (false, None) => unsupported("expanding to a new symbolic size"),
            }
        })
        .collect::<OpResult<_>>()?;
    let x = if xd.len() < rank { reshape_to(&x, &[vec![one_; rank - xd.len()], xd].concat())? } else { x };
    one(x.expand(&dims)?)
}

fn tile(node: &Node) -> OpResult<Vec<Value>> {
    let mut x = node.tensor(0)?;
    let reps = node.const_ints(1, "repeat count")?.ok_or(OpError::Invalid("input 1 (repeats) is required".into()))?;
    if reps.len() != x.rank() || reps.iter().any(|&r| r < 0) {
        return invalid(format!("repeats {reps:?} for a rank-{} tensor", x.rank()));
    }
    let numel: usize = x.shape().as_concrete().map_or(0, |d| d.iter().product());
    let grown = reps.iter().try_fold(numel.max(1), |n, &r| n.checked_mul(r as usize));
    if grown.is_none_or(|n| n > i32::MAX as usize) {
        return invalid(format!("repeats {reps:?} make more than 2^31 elements"));
    }
    for (a, &r) in reps.iter().enumerate() {
        if r != 1 {
            let copies: Vec<&Tensor> = std::iter::repeat_n(&x, r as usize).collect();
            if copies.is_empty() {
                return unsupported("a repeat count of zero");
            }
            x = Tensor::concat(&copies, a as isize)?;
        }
    }
    one(x)
}

fn pad(node: &Node) -> OpResult<Vec<Value>> {
    let mode = node.string("mode").unwrap_or_else(|| "constant".into());
    let fill = |value: f64| match mode.as_str() {
        "constant" => Some(PadMode::Constant(value)),
        "reflect" => Some(PadMode::Reflect),
        "edge" => Some(PadMode::Replicate),
        "wrap" => Some(PadMode::Circular),
        _ => None,
    };
    if fill(0.0).is_none() {
        return unsupported(format!("Pad mode {mode:?}"));
    }
    let x = node.tensor(0)?;
    let r = x.rank();
    let (pads, value) = if node.opset() < 11 {
        (node.ints("pads").unwrap_or_default(), node.float("value", 0.0))
    } else {
        let pads = node.const_ints(1, "list of pads")?.unwrap_or_default();
        let value = match node.host_values(2)? {
            None => 0.0,
            Some(v) if v.len() == 1 => v[0],
            Some(v) => return invalid(format!("a pad value of {} elements", v.len())),
        };
        (pads, value)
    };
    let axes: Vec<usize> = match node.const_ints(3, "list of axes")? {
        Some(a) => a.iter().map(|&a| axis(a, r)).collect::<OpResult<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return invalid(format!("pads {pads:?} for {} axes", axes.len()));
    }
    if pads.iter().any(|&p| p < 0) {
        return unsupported("negative pads (cropping)");
    }
    let mut per_axis = vec![(0usize, 0usize); r];
    for (i, &a) in axes.iter().enumerate() {
        per_axis[a] = (pads[i] as usize, pads[i + axes.len()] as usize);
    }
    one(x.pad_with(&per_axis, fill(value).unwrap_or(PadMode::Constant(value)))?)
}

fn range(node: &Node) -> OpResult<Vec<Value>> {
    let scalar = |i: usize| -> OpResult<Option<f64>> { Ok(node.host_values(i)?.and_then(|v| v.first().copied())) };
    let (Some(start), Some(limit), Some(delta)) = (scalar(0)?, scalar(1)?, scalar(2)?) else {
        return invalid("Range needs start, limit and delta");
    };
    if delta == 0.0 {
        return invalid("delta 0");
    }
    let dtype = node.value(0).map_or(DType::F32, Value::dtype);
    let n = ((limit - start) / delta).ceil().max(0.0) as usize;
    if dtype.is_int() && n <= 4096 {
        let values = (0..n).map(|k| Expr::constant((start + k as f64 * delta) as i64)).collect();
        return Ok(vec![Value::Ints(Ints { dims: vec![n], dtype, values })]);
    }
    one(Tensor::arange(start, start + n as f64 * delta, delta, dtype)?)
}

fn reduce(node: &Node, op: &str) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let r = x.rank();
    let from = if op == "ReduceSum" { 13 } else { 18 };
    let given = axes_of(node, 1, from)?;
    let keep = node.int("keepdims", 1) != 0;
    let axes: Vec<isize> = match given {
        Some(a) if !a.is_empty() => a.iter().map(|&a| axis(a, r).map(|v| v as isize)).collect::<OpResult<_>>()?,
        _ if node.int("noop_with_empty_axes", 0) != 0 => return one(x),
        _ => (0..r as isize).collect(),
    };
    let extreme = matches!(op, "ReduceMax" | "ReduceMin" | "ReduceLogSumExp");
    // An empty reduction of a max or min has no element to return: ONNX defines it as the dtype's lowest
    // (max) or highest (min) value.
    let empty = axes.iter().any(|&a| x.shape().dims()[a as usize].as_const() == Some(0));
    if extreme && empty {
        let mut dims =
            x.shape().as_concrete().ok_or(OpError::Unsupported("an empty reduction of symbolic shape".into()))?;
        let mut kept = vec![];
        for (i, d) in dims.iter_mut().enumerate() {
            if axes.contains(&(i as isize)) {
                *d = 1;
                if !keep {
                    continue;
                }
            }
            kept.push(*d);
        }
        let low = op != "ReduceMin";
        let fill = if low { x.dtype().min_value() } else { x.dtype().max_value() };
        return one(Tensor::full(fill, &kept, x.dtype())?);
    }
    // Max and min of booleans are any and all.
    if x.dtype() == DType::Bool && matches!(op, "ReduceMax" | "ReduceMin") {
        let i = x.cast(DType::I32)?;
        let y = if op == "ReduceMax" { i.max(&axes, keep)? } else { i.min(&axes, keep)? };
        return one(y.cast(DType::Bool)?);
    }
    let y = match op {
        "ReduceSum" => x.sum(&axes, keep)?,
        "ReduceMean" => x.mean(&axes, keep)?,
        "ReduceMax" => x.max(&axes, keep)?,
        "ReduceMin" => x.min(&axes, keep)?,
        "ReduceL1" => x.abs()?.sum(&axes, keep)?,
        "ReduceL2" => x.mul(&x)?.sum(&axes, keep)?.sqrt()?,
        "ReduceSumSquare" => x.mul(&x)?.sum(&axes, keep)?,
        "ReduceLogSum" => x.sum(&axes, keep)?.log()?,
        "ReduceProd" if x.dtype().is_float() => float_product(&x, &axes, keep)?,
        "ReduceLogSumExp" => {
            let m = x.max(&axes, true)?;
            // A row of -inf would give -inf - -inf = NaN: shift by zero there instead.
            let m = m.isnan()?.logical_or(&m.eq(f64::NEG_INFINITY)?)?.where_(0.0, &m)?;
            let s = x.sub(&m)?.exp()?.sum(&axes, true)?.log()?.add(&m)?;
            if keep {
                s
            } else {
                reshape_to(&s, &reduced_dims(&x, &axes))?
            }
        }
        _ => return unsupported(format!("op {op}")),
    };
    one(y)
}

fn reduced_dims(x: &Tensor, axes: &[isize]) -> Vec<Expr> {
    x.shape()
        .dims()
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(&(*i as isize)))
        .map(|(_, d)| d.clone())
        .collect()
}

/// The upper (or lower) triangle of the last two axes, shifted by `k` diagonals; the rest zero.
fn trilu(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let k = node.host_values(1)?.and_then(|v| v.first().copied()).unwrap_or(0.0);
    let r = x.rank();
    if r < 2 {
        return invalid("needs rank >= 2");
    }
    let d = x.shape().dims().to_vec();
    let (Some(rows), Some(cols)) = (d[r - 2].as_const(), d[r - 1].as_const()) else {
        return unsupported("Trilu over symbolic sizes");
    };
    let i = Tensor::arange(0.0, rows as f64, 1.0, DType::I64)?.reshape(&[rows as isize, 1])?;
    let j = Tensor::arange(0.0, cols as f64, 1.0, DType::I64)?.reshape(&[1, cols as isize])?;
    let diag = j.sub(&i)?;
    let keep = if node.int("upper", 1) != 0 { diag.ge(k)? } else { diag.le(k)? };
    one(keep.where_(&x, 0.0)?)
}

/// DepthToSpace (`DCR` or `CRD` order) and SpaceToDepth: a reshape, a permutation and a reshape.
fn depth_space(node: &Node, to_space: bool) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let b = node.int("blocksize", 0);
    let Some(d) = x.shape().as_concrete().filter(|d| d.len() == 4) else {
        return unsupported("a block rearrangement of a tensor other than [N, C, H, W] with constant dims");
    };
    if b < 1 {
        return invalid(format!("blocksize {b}"));
    }
    if b > 1 << 16 || (b * b) as usize > d[1].max(d[2] * d[3]).max(1) {
        return invalid(format!("blocksize {b} for {d:?}"));
    }
    let (n, c, h, w, b) = (d[0] as isize, d[1] as isize, d[2] as isize, d[3] as isize, b as isize);
    let y = if to_space {
        if c % (b * b) != 0 {
            return invalid(format!("{c} channels for blocksize {b}"));
        }
        let crd = node.string("mode").as_deref() == Some("CRD");
        let (split, perm): ([isize; 6], [isize; 6]) = if crd {
            ([n, c / (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3])
        } else {
            ([n, b, b, c / (b * b), h, w], [0, 3, 4, 1, 5, 2])
        };
        x.reshape(&split)?.permute(&perm)?.reshape(&[n, c / (b * b), h * b, w * b])?
    } else {
        if h % b != 0 || w % b != 0 {
            return invalid(format!("{h}x{w} for blocksize {b}"));
        }
        x.reshape(&[n, c, h / b, b, w / b, b])?.permute(&[0, 3, 5, 1, 2, 4])?.reshape(&[n, c * b * b, h / b, w / b])?
    };
    one(y)
}

/// Ones on the `k`-th diagonal of a 2-D tensor shaped like the input.
fn eye_like(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let Some(d) = x.shape().as_concrete().filter(|d| d.len() == 2) else {
        return invalid("needs a 2-D input of constant shape");
    };
    let dtype = match node.proto.attribute.iter().find(|a| a.name() == "dtype") {
        Some(a) => crate::tensor::dtype_of(a.i() as i32).map_err(OpError::Unsupported)?,
        None => x.dtype(),
    };
    let k = node.int("k", 0) as f64;
    let i = Tensor::arange(0.0, d[0] as f64, 1.0, DType::I64)?.reshape(&[d[0] as isize, 1])?;
    let j = Tensor::arange(0.0, d[1] as f64, 1.0, DType::I64)?.reshape(&[1, d[1] as isize])?;
    one(j.sub(&i)?.eq(k)?.where_(1.0, 0.0)?.cast(dtype)?)
}

/// `values[1]` where the position along the new axis equals the index (negative indices count from
/// `depth`), `values[0]` elsewhere.
fn one_hot(node: &Node) -> OpResult<Vec<Value>> {
    let idx = node.tensor(0)?;
    let depth =
        node.host_values(1)?.and_then(|v| v.first().copied()).ok_or(OpError::Invalid("depth is required".into()))?;
    let values = node.tensor(2)?;
    let depth = depth as usize;
    let r = idx.rank() + 1;
    let a = axis(node.int("axis", -1), r)?;
    let idx = if idx.dtype().is_float() { idx.floor()? } else { idx.clone() };
    let idx = idx.lt(0.0)?.where_(idx.add(depth as f64)?, &idx)?.cast(DType::I64)?;
    let mut shape = vec![1isize; r];
    shape[a] = depth as isize;
    let iota = Tensor::arange(0.0, depth as f64, 1.0, DType::I64)?.reshape(&shape)?;
    let hot = iota.eq(&idx.unsqueeze(a as isize)?)?;
    let (off, on) = (values.narrow(0, 0, 1)?.reshape(&[])?, values.narrow(0, 1, 1)?.reshape(&[])?);
    one(hot.where_(&on, &off)?)
}

/// Running sums along an axis as a product with a triangular matrix of ones (`exclusive` drops the
/// diagonal, `reverse` sums from the end).
fn cumsum(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let a = node.host_values(1)?.and_then(|v| v.first().copied()).ok_or(OpError::Invalid("axis is required".into()))?;
    let a = axis(a as i64, x.rank())?;
    let Some(n) = x.shape().dims()[a].as_const() else {
        return unsupported("CumSum along a symbolic axis");
    };
    let (exclusive, reverse) = (node.int("exclusive", 0) != 0, node.int("reverse", 0) != 0);
    let i = Tensor::arange(0.0, n as f64, 1.0, DType::I64)?.reshape(&[n as isize, 1])?;
    let j = Tensor::arange(0.0, n as f64, 1.0, DType::I64)?.reshape(&[1, n as isize])?;
    // m[i][j] = 1 when input position i adds into output position j.
    let m = match (reverse, exclusive) {
        (false, false) => i.le(&j)?,
        (false, true) => i.lt(&j)?,
        (true, false) => i.ge(&j)?,
        (true, true) => i.gt(&j)?,
    };
    let m = m.where_(1.0, 0.0)?.cast(x.dtype())?;
    let last = x.rank() as isize - 1;
    let moved = x.transpose(a as isize, last)?;
    one(moved.matmul(&m)?.transpose(a as isize, last)?)
}

/// CenterCropPad: each listed axis (all by default) cropped or zero-padded to its size in `shape`,
/// keeping the centre (the odd element goes to the end).
fn center_crop_pad(node: &Node) -> OpResult<Vec<Value>> {
    let x = node.tensor(0)?;
    let r = x.rank();
    let Some(sizes) = node.const_ints(1, "shape")? else { return invalid("shape is required") };
    let axes: Vec<usize> = match node.ints("axes") {
        Some(a) => a.iter().map(|&a| axis(a, r)).collect::<OpResult<_>>()?,
        None => (0..r).collect(),
    };
    if axes.len() != sizes.len() {
        return invalid(format!("{} sizes for {} axes", sizes.len(), axes.len()));
    }
    let mut y = x;
    for (&a, &want) in axes.iter().zip(&sizes) {
        let Some(have) = y.shape().dims()[a].as_const() else {
            return unsupported("CenterCropPad over a symbolic size");
        };
        if want < 0 {
            return invalid(format!("size {want}"));
        }
        if want < have {
            y = y.narrow(a as isize, ((have - want) / 2) as usize, want as usize)?;
        } else if want > have {
            let d = (want - have) as usize;
            let mut pads = vec![(0usize, 0usize); r];
            pads[a] = (d / 2, d - d / 2);
            y = y.pad(&pads, 0.0)?;
        }
    }
    one(y)
}

/// BlackmanWindow, HammingWindow and HannWindow: the window of `size` points (periodic by default, as
/// torch's), computed on the host in f64 and rounded once to `output_datatype` (f32 by default).
fn window(node: &Node, op: &str) -> OpResult<Vec<Value>> {
    let size =
        node.host_values(0)?.and_then(|v| v.first().copied()).ok_or(OpError::Invalid("size is required".into()))?;
    if !(0.0..=f64::from(u32::MAX)).contains(&size) || size.fract() != 0.0 {
        return invalid(format!("a window of {size} points"));
    }
    // Computed on the host: a size read from a malformed file must not ask it for gigabytes.
    if size > f64::from(1u32 << 26) {
        return unsupported(format!("a window of {size} points (at most 2^26)"));
    }
    let n = size as usize;
    let dtype = node.output_datatype()?;
    let period = if node.int("periodic", 1) != 0 { size } else { size - 1.0 };
    let tau = std::f64::consts::TAU;
    let values: Vec<f64> = (0..n)
        .map(|i| {
            let t = i as f64 / period;
            match op {
                "BlackmanWindow" => 0.42 - 0.5 * (tau * t).cos() + 0.08 * (2.0 * tau * t).cos(),
                "HammingWindow" => 25.0 / 46.0 - (21.0 / 46.0) * (tau * t).cos(),
                _ => (std::f64::consts::PI * t).sin().powi(2),
            }
        })
        .collect();
    one(Tensor::from_data(kiln_graph::TensorData::from_f64(values, &[n], dtype)?))
}

/// GatherND: each index tuple (the last axis of `indices`, `k` long) picks a slice of `data` after its
/// first `batch_dims` axes, as one `index_select` over `data` with those `batch_dims + k` axes flattened:
/// the tuple's row-major offset plus its batch entry's.
fn gather_nd(node: &Node) -> OpResult<Vec<Value>> {
    let (x, idx) = (node.tensor(0)?, node.tensor(1)?);
    let (Some(xd), Some(id)) = (x.shape().as_concrete(), idx.shape().as_concrete()) else {
        return unsupported("GatherND over symbolic sizes");
    };
    let b = usize::try_from(node.int("batch_dims", 0)).map_err(|_| OpError::Invalid("negative batch_dims".into()))?;
    let Some(&k) = id.last() else { return invalid("indices of rank 0") };
    if id.len() <= b || xd.len() < b + k || xd[..b] != id[..b] {
        return invalid(format!("indices {id:?} into data {xd:?} with batch_dims {b}"));
    }
    let batch: usize = xd[..b].iter().product();
    let picked: usize = xd[b..b + k].iter().product();
    let tuples: usize = id[b..id.len() - 1].iter().product();
    let idx = idx.cast(DType::I64)?.reshape(&[batch as isize, tuples as isize, k as isize])?;
    // Each tuple's offset within its batch entry's `picked` slices, negative indices counted from the end.
    let mut offset: Option<Tensor> = None;
    let mut stride = picked;
    for (i, &d) in xd[b..b + k].iter().enumerate() {
        stride /= d;
        let part = wrap_negative(
            &idx.narrow(2, i, 1)?.reshape(&[batch as isize, tuples as isize])?,
            &Expr::constant(d as i64),
        )?;
        let part = part.mul(stride as f64)?;
        offset = Some(match offset {
            Some(o) => o.add(&part)?,
            None => part,
        });
    }
    let offset = match offset {
        Some(o) => o,
        None => Tensor::full(0.0, &[batch, tuples], DType::I64)?,
    };
    let base = Tensor::arange(0.0, batch as f64, 1.0, DType::I64)?.mul(picked as f64)?.reshape(&[batch as isize, 1])?;
    let flat = offset.add(&base)?.reshape(&[-1])?;
    let rest: Vec<isize> = xd[b + k..].iter().map(|&d| d as isize).collect();
    let data = x.reshape(&[&[(batch * picked) as isize][..], &rest].concat())?;
    let out: Vec<isize> = id[..id.len() - 1].iter().map(|&d| d as isize).chain(rest.iter().copied()).collect();
    one(data.index_select(0, &flat)?.reshape(&out)?)
}

/// The product of float `x` over `axes` (kiln has no product reduction). Sign and magnitude apart:
/// |prod| = exp(sum(log|x|)), negative when an odd number of factors is, zero when one is.
pub(super) fn float_product(x: &Tensor, axes: &[isize], keep: bool) -> kiln_graph::Result<Tensor> {
    let mag = x.abs()?.log()?.sum(axes, keep)?.exp()?;
    let negatives = x.lt(0.0)?.cast(x.dtype())?.sum(axes, keep)?;
    let odd = negatives.sub(&negatives.div(2.0)?.floor()?.mul(2.0)?)?.gt(0.5)?;
    let zero = x.eq(0.0)?.cast(x.dtype())?.sum(axes, keep)?.gt(0.0)?;
    zero.where_(0.0, &odd.where_(mag.neg()?, &mag)?)
}

#[cfg(test)]
mod tests {
    use super::slice_positions;

    /// ONNX's clamping, both directions: a negative step walks down from a start clamped to the last
    /// position to an end clamped to one before the first (so `i64::MIN` reaches the first).
    #[test]
    fn slice_positions_clamp_as_onnx_does() {
        assert_eq!(slice_positions(0, 10, 3, 7), vec![0, 3, 6]);
        assert_eq!(slice_positions(-1, i64::MIN, -1, 4), vec![3, 2, 1, 0]);
        assert_eq!(slice_positions(20, 0, -2, 5), vec![4, 2]);
        assert_eq!(slice_positions(1, 3, -1, 5), Vec::<i64>::new());
    }
}
