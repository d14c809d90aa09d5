//! The convolution family — convolution, transposed convolution and pooling over 1 to 3 trailing spatial
//! axes (`[N, C, *spatial]`, PyTorch's and ONNX's layout): the window geometry and its shape rule, the
//! `Tensor` methods that record them, the f64 reference and the decomposition into primitives.
//!
//! They are composites: traced whole (so explain and the explorer say `conv`), computed directly by the
//! reference, and decomposed into an `unfold` (the im2col view: every window as a new axis) and one
//! matmul per group with the batch folded into its columns; a pool is a reduction over the unfolded axis.
//! The unfold folds into the index expressions of the kernel that writes the im2col matrix (with the
//! activation before the convolution fused in), so a convolution is two kernels. A large stride-1
//! convolution on a target that asks for it is one product per kernel row instead (`conv_by_rows`).

use crate::data::TensorData;
use crate::decompose::Builder;
use crate::error::{Error, Result};
use crate::interp::nan_max;
use crate::ir::{DTypeRule, Op, PoolKind, ReduceOp};
use crate::loc::SourceLoc;
use crate::shape::Shape;
use crate::sym::Expr;
use crate::trace::{record, Tensor};
use crate::NodeId;
use serde::{Deserialize, Serialize};

/// Where a sliding window sits along each spatial axis (one entry per axis; empty vectors mean stride 1,
/// no padding, dilation 1 on every axis).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Window {
    /// Step between window positions.
    pub stride: Vec<usize>,
    /// Zeros (or `-inf` for max pooling) added before and after each axis.
    pub padding: Vec<(usize, usize)>,
    /// Spacing between kernel taps (1 = dense).
    pub dilation: Vec<usize>,
}

impl Window {
    /// A window with the same `stride`, symmetric `padding` and `dilation` on all `rank` axes.
    pub fn uniform(rank: usize, stride: usize, padding: usize, dilation: usize) -> Window {
        Window { stride: vec![stride; rank], padding: vec![(padding, padding); rank], dilation: vec![dilation; rank] }
    }

    /// The same window with every axis written out (rank `r`), or a message when a vector has another length
    /// or a stride/dilation is zero.
    fn resolved(&self, r: usize) -> std::result::Result<Window, String> {
        let fill = |v: &[usize], d: usize, what: &str| match v.len() {
            0 => Ok(vec![d; r]),
            n if n == r => Ok(v.to_vec()),
            n => Err(format!("{what} has {n} entries for {r} spatial axes")),
        };
        let w = Window {
            stride: fill(&self.stride, 1, "stride")?,
            dilation: fill(&self.dilation, 1, "dilation")?,
            padding: match self.padding.len() {
                0 => vec![(0, 0); r],
                n if n == r => self.padding.clone(),
                n => return Err(format!("padding has {n} entries for {r} spatial axes")),
            },
        };
        if w.stride.contains(&0) || w.dilation.contains(&0) {
            return Err("strides and dilations must be at least 1".into());
        }
        Ok(w)
    }

    /// The output length along spatial axis `a` for input length `len` and kernel size `k`:
    /// `floor((len + pads - dilation*(k-1) - 1) / stride) + 1`.
    pub fn out_len(&self, a: usize, len: &Expr, k: usize) -> Expr {
        let (pb, pa) = self.padding[a];
        let span = (self.dilation[a] * (k - 1) + 1) as i64;
        (len.clone() + (pb + pa) as i64 - span).floor_div(&Expr::from(self.stride[a])) + 1
    }
}

/// Checks `x` is `[N, C, *spatial]` with `r` spatial axes and the window fits; returns the resolved
/// window and the output's spatial dims.
fn spatial_out(op: &str, x: &Shape, kernel: &[usize], window: &Window, loc: &SourceLoc) -> Result<(Window, Vec<Expr>)> {
    let r = kernel.len();
    let bad = |msg: String| Error::Shape { op: op.into(), msg, loc: loc.clone() };
    if !(1..=3).contains(&r) || x.rank() != r + 2 {
        return Err(bad(format!(
            "a {r}-D window needs an input [N, C, {r} spatial axes], got {}",
            crate::trace::shape_for_humans(x)
        )));
    }
    if kernel.contains(&0) {
        return Err(bad(format!("kernel size {kernel:?} has a zero")));
    }
    let w = window.resolved(r).map_err(bad)?;
    let mut out = Vec::with_capacity(r);
    for (a, &k) in kernel.iter().enumerate() {
        let span = w.dilation[a].checked_mul(k - 1).and_then(|s| s.checked_add(w.padding[a].0 + w.padding[a].1 + 1));
        if span.is_none_or(|s| s > i32::MAX as usize) || w.stride[a] > i32::MAX as usize {
            return Err(bad(format!("window of kernel {k}, {:?} is too large on spatial axis {a}", w)));
        }
        let o = w.out_len(a, &x.dims()[a + 2], k);
        if o.as_const().is_some_and(|o| o < 1) {
            return Err(bad(format!(
                "spatial axis {a} of {} is too short for a kernel of {} (dilation {}, padding {:?})",
                crate::trace::shape_for_humans(x),
                k,
                w.dilation[a],
                w.padding[a]
            )));
        }
        out.push(o);
    }
    Ok((w, out))
}

fn dims_of(x: &Shape, from: usize) -> Vec<usize> {
    x.dims()[from..].iter().map(|d| d.as_const().unwrap_or(-1).max(0) as usize).collect()
}

impl Tensor {
    /// Convolution of `self` `[N, C, *spatial]` (1 to 3 spatial axes) with `weight`
    /// `[O, C/groups, *kernel]`, plus `bias` `[O]` (torch's `conv1d`/`conv2d`/`conv3d`); `groups == C`
    /// is a depthwise convolution.
    #[track_caller]
    pub fn conv(&self, weight: &Tensor, bias: Option<&Tensor>, window: &Window, groups: usize) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let (xs, ws) = (self.shape(), weight.shape());
        let bad = |msg: String| Error::Shape { op: "conv".into(), msg, loc: loc.clone() };
        // Integer convolutions (ONNX's `ConvInteger`) are exact: products of i32 or i64 accumulate as
        // integer matmuls do.
        same_dtype_as("conv", DTypeRule::Wide, self, &[Some(weight), bias], &loc)?;
        if ws.rank() < 3 {
            return Err(bad(format!("weight {ws} must be [out, in/groups, *kernel]")));
        }
        let wd = ws.as_concrete().ok_or_else(|| bad(format!("weight {ws} must have constant dims")))?;
        let (w, spatial) = spatial_out("conv", &xs, &wd[2..], window, &loc)?;
        let (o, cg) = (wd[0], wd[1]);
        let c = &xs.dims()[1];
        if groups == 0 || o % groups != 0 || c.as_const() != Some((cg * groups) as i64) {
            return Err(bad(format!(
                "input {} with {groups} group(s) does not fit weight {ws} ([out, in/groups, *kernel], out divisible \
                 by groups)",
                crate::trace::shape_for_humans(&xs)
            )));
        }
        if let Some(b) = bias {
            if b.shape() != Shape::from_dims(&[o]) {
                return Err(bad(format!("bias {} must be [{o}]", b.shape())));
            }
        }
        let mut dims = vec![xs.dims()[0].clone(), Expr::from(o)];
        dims.extend(spatial);
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        record(Op::Conv { window: w, groups, bias: bias.is_some() }, &inputs, self.dtype(), Shape(dims), loc)
    }

    /// Max pooling over the trailing `kernel.len()` axes (padding counts as `-inf`).
    #[track_caller]
    pub fn max_pool(&self, kernel: &[usize], window: &Window) -> Result<Tensor> {
        self.pool(PoolKind::Max, kernel, window, SourceLoc::caller())
    }

    /// Average pooling over the trailing `kernel.len()` axes; `count_include_pad` divides every window by
    /// the kernel's size, else by the taps that fall inside the input (torch's and ONNX's two rules).
    #[track_caller]
    pub fn avg_pool(&self, kernel: &[usize], window: &Window, count_include_pad: bool) -> Result<Tensor> {
        self.pool(PoolKind::Avg { count_include_pad }, kernel, window, SourceLoc::caller())
    }

    fn pool(&self, kind: PoolKind, kernel: &[usize], window: &Window, loc: SourceLoc) -> Result<Tensor> {
        let name = kind.name();
        // A max is exact in every numeric dtype (ONNX pools bytes); an average is a float's.
        let rule = if kind == PoolKind::Max { DTypeRule::Numeric } else { DTypeRule::Float };
        crate::ops::check_dtype(name, rule, self.dtype(), &loc)?;
        let xs = self.shape();
        let (w, spatial) = spatial_out(name, &xs, kernel, window, &loc)?;
        let mut dims = xs.dims()[..2].to_vec();
        dims.extend(spatial);
        record(Op::Pool { mode: kind, kernel: kernel.to_vec(), window: w }, &[self], self.dtype(), Shape(dims), loc)
    }
}

impl Tensor {
    /// Transposed convolution (torch's `conv_transpose1d/2d/3d`, the gradient of [`Tensor::conv`] with
    /// respect to its input): `self` `[N, C_in, *in]`, `weight` `[C_in, C_out/groups, *kernel]`, bias
    /// `[C_out]`; output length `(in-1)*stride - pads + dilation*(k-1) + 1 + output_padding` per axis.
    ///
    /// Recorded as the convolution it equals — zeros inserted between inputs (`stride - 1` per gap),
    /// padding `dilation*(k-1) - pad`, and the kernel flipped with its channel axes swapped per group — so
    /// it fuses, caches and differentiates as those ops do.
    #[track_caller]
    pub fn conv_transpose(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        window: &Window,
        output_padding: &[usize],
        groups: usize,
    ) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        let bad = |msg: String| Error::Shape { op: "conv_transpose".into(), msg, loc: loc.clone() };
        same_dtype_as("conv_transpose", DTypeRule::Float, self, &[Some(weight), bias], &loc)?;
        let (xs, ws) = (self.shape(), weight.shape());
        let wd = ws.as_concrete().ok_or_else(|| bad(format!("weight {ws} must have constant dims")))?;
        let r = wd.len().saturating_sub(2);
        if !(1..=3).contains(&r) || xs.rank() != r + 2 {
            return Err(bad(format!(
                "input {} does not fit weight {ws} ([in, out/groups, *kernel])",
                crate::trace::shape_for_humans(&xs)
            )));
        }
        let w = window.resolved(r).map_err(bad)?;
        let out_pad = if output_padding.is_empty() { vec![0; r] } else { output_padding.to_vec() };
        if out_pad.len() != r || (0..r).any(|a| out_pad[a] >= w.stride[a].max(w.dilation[a])) {
            return Err(bad(format!(
                "output_padding {output_padding:?} must be below the stride or dilation on each of {r} axes"
            )));
        }
        let (cin, cog) = (wd[0], wd[1]);
        if groups == 0 || cin % groups != 0 || xs.dims()[1].as_const() != Some(cin as i64) {
            return Err(bad(format!(
                "input {} with {groups} group(s) does not fit weight {ws}",
                crate::trace::shape_for_humans(&xs)
            )));
        }
        let kernel = &wd[2..];
        let fits = kernel.iter().enumerate().all(|(a, &k)| {
            k >= 1 && w.dilation[a].checked_mul(k - 1).is_some_and(|s| s <= i32::MAX as usize) && w.stride[a] <= 1 << 16
        });
        if !fits {
            return Err(bad(format!("kernel {kernel:?} with {w:?} is empty or too large")));
        }
        let mut x = self.clone();
        for a in 0..r {
            let ax = 2 + a;
            let len = x.shape().dims()[ax]
                .as_const()
                .ok_or_else(|| bad(format!("spatial axis {a} must be constant")))? as usize;
            if w.stride[a] > 1 && len > 1 {
                // [.., L, ..] -> [.., L, s, ..] (zeros after each element) -> [.., L*s, ..] -> drop the tail.
                let mut pads = vec![(0, 0); x.rank() + 1];
                pads[ax + 1] = (0, w.stride[a] - 1);
                let spread = x.unsqueeze(ax as isize + 1)?.pad(&pads, 0.0)?;
                let mut dims = x.shape().view_dims();
                dims[ax] = (len * w.stride[a]) as isize;
                x = spread.reshape(&dims)?.narrow(ax as isize, 0, (len - 1) * w.stride[a] + 1)?;
            }
            let full = w.dilation[a] * (kernel[a] - 1);
            let (before, after) =
                (full as i64 - w.padding[a].0 as i64, full as i64 - w.padding[a].1 as i64 + out_pad[a] as i64);
            let mut pads = vec![(0, 0); x.rank()];
            pads[ax] = (before.max(0) as usize, after.max(0) as usize);
            if before > 0 || after > 0 {
                x = x.pad(&pads, 0.0)?;
            }
            let cur = x.shape().dims()[ax].as_const().unwrap_or(0);
            let (lo, hi) = ((-before).max(0), cur - (-after).max(0));
            if hi <= lo {
                return Err(bad(format!("padding {:?} leaves nothing of spatial axis {a}", w.padding[a])));
            }
            if lo > 0 || hi < cur {
                x = x.narrow(ax as isize, lo as usize, (hi - lo) as usize)?;
            }
        }
        // [C_in, C_out/g, *k] -> [g, C_in/g, C_out/g, *k] -> [g, C_out/g, C_in/g, *k] -> [C_out, C_in/g, *k].
        let mut dims: Vec<isize> = vec![groups as isize, (cin / groups) as isize, cog as isize];
        dims.extend(kernel.iter().map(|&k| k as isize));
        let mut perm: Vec<isize> = vec![0, 2, 1];
        perm.extend((3..3 + r as isize).collect::<Vec<_>>());
        let mut flat: Vec<isize> = vec![(groups * cog) as isize, (cin / groups) as isize];
        flat.extend(kernel.iter().map(|&k| k as isize));
        let mut wt = weight.reshape(&dims)?.permute(&perm)?.reshape(&flat)?;
        for (a, &k) in kernel.iter().enumerate() {
            if k > 1 {
                let taps: Vec<Tensor> = (0..k).rev().map(|i| wt.narrow(2 + a as isize, i, 1)).collect::<Result<_>>()?;
                wt = Tensor::concat(&taps.iter().collect::<Vec<_>>(), 2 + a as isize)?;
            }
        }
        let inner = Window { stride: vec![1; r], padding: vec![(0, 0); r], dilation: w.dilation.clone() };
        x.conv(&wt, bias, &inner, groups)
    }
}

/// `x` of a dtype `rule` allows and every other tensor of its dtype.
fn same_dtype_as(op: &str, rule: DTypeRule, x: &Tensor, others: &[Option<&Tensor>], loc: &SourceLoc) -> Result<()> {
    crate::ops::check_dtype(op, rule, x.dtype(), loc)?;
    let others: Vec<&Tensor> = others.iter().flatten().copied().collect();
    crate::ops::check_same_dtype(op, x.dtype(), &others, loc)
}

/// The per-axis offsets of kernel tap `t` (taps numbered row-major over `kernel`).
pub(crate) fn tap_offsets(t: usize, kernel: &[usize]) -> Vec<usize> {
    let mut rest = t;
    let mut offsets = vec![0; kernel.len()];
    for a in (0..kernel.len()).rev() {
        offsets[a] = rest % kernel[a];
        rest /= kernel[a];
    }
    offsets
}

/// Visits every kernel tap of a window over `out` positions: `f(out_index, input_index_or_padding)`
/// for each output element and tap, in row-major output order then tap order.
fn for_each_tap(
    in_dims: &[usize],
    out_dims: &[usize],
    kernel: &[usize],
    w: &Window,
    mut f: impl FnMut(usize, usize, Option<usize>),
) {
    let r = kernel.len();
    let taps: usize = kernel.iter().product();
    let outs: usize = out_dims.iter().product();
    for o in 0..outs {
        for t in 0..taps {
            let (mut oi, mut ti, mut flat, mut inside) = (o, t, 0usize, true);
            let mut stride = 1;
            for a in (0..r).rev() {
                let (op, tp) = (oi % out_dims[a], ti % kernel[a]);
                oi /= out_dims[a];
                ti /= kernel[a];
                let pos = (op * w.stride[a] + tp * w.dilation[a]) as i64 - w.padding[a].0 as i64;
                inside &= pos >= 0 && (pos as usize) < in_dims[a];
                flat += pos.max(0) as usize * stride;
                stride *= in_dims[a];
            }
            f(o, t, inside.then_some(flat));
        }
    }
}

/// The reference convolution in f64, straight from the definition. `x` `[N, C, *in]`, `w`
/// `[O, C/g, *k]`, output `[N, O, *out]`.
pub(crate) fn reference_conv(
    x: &TensorData,
    w: &TensorData,
    bias: Option<&TensorData>,
    out: &[usize],
    window: &Window,
    groups: usize,
) -> Vec<f64> {
    let (xd, wd, bias) = (x.dims(), w.dims(), bias.map(TensorData::values));
    let (x, w) = (x.values(), w.values());
    let (n, c, o) = (xd[0], xd[1], wd[0]);
    let (cg, og) = (c / groups, o / groups);
    let kernel = &wd[2..];
    let taps: usize = kernel.iter().product();
    let (in_sp, out_sp): (usize, usize) = (xd[2..].iter().product(), out[2..].iter().product());
    let mut y = vec![0.0; n * o * out_sp];
    for b in 0..n {
        for oc in 0..o {
            let g = oc / og;
            let base = (b * o + oc) * out_sp;
            for ic in 0..cg {
                let xin = &x[(b * c + g * cg + ic) * in_sp..][..in_sp];
                let wk = &w[(oc * cg + ic) * taps..][..taps];
                for_each_tap(&xd[2..], &out[2..], kernel, window, |p, t, at| {
                    if let Some(at) = at {
                        y[base + p] += xin[at] * wk[t];
                    }
                });
            }
            if let Some(bias) = bias {
                y[base..base + out_sp].iter_mut().for_each(|v| *v += bias[oc]);
            }
        }
    }
    y
}

/// The reference unfold in f64: `[N, C, *in]` to `[N, C, taps, *out]`, `value` where a tap falls in the
/// padding.
pub(crate) fn reference_unfold(
    x: &[f64],
    xd: &[usize],
    out: &[usize],
    kernel: &[usize],
    window: &Window,
    value: f64,
) -> Vec<f64> {
    let (in_sp, out_sp): (usize, usize) = (xd[2..].iter().product(), out[3..].iter().product());
    let taps: usize = kernel.iter().product();
    let planes = xd[0] * xd[1];
    let mut y = vec![value; planes * taps * out_sp];
    for p in 0..planes {
        let xin = &x[p * in_sp..][..in_sp];
        let base = p * taps * out_sp;
        for_each_tap(&xd[2..], &out[3..], kernel, window, |o, t, at| {
            if let Some(at) = at {
                y[base + t * out_sp + o] = xin[at];
            }
        });
    }
    y
}

/// The reference pooling in f64: each output combines its window's taps inside the input; a max starts
/// from `lowest`, the dtype's lowest value (as the decomposition's padding does).
pub(crate) fn reference_pool(
    x: &[f64],
    lowest: f64,
    xd: &[usize],
    out: &[usize],
    kind: PoolKind,
    kernel: &[usize],
    window: &Window,
) -> Vec<f64> {
    let (in_sp, out_sp): (usize, usize) = (xd[2..].iter().product(), out[2..].iter().product());
    let taps: usize = kernel.iter().product();
    let planes = xd[0] * xd[1];
    let mut y = Vec::with_capacity(planes * out_sp);
    for p in 0..planes {
        let xin = &x[p * in_sp..][..in_sp];
        let mut acc = vec![(if kind == PoolKind::Max { lowest } else { 0.0 }, 0usize); out_sp];
        for_each_tap(&xd[2..], &out[2..], kernel, window, |o, _, at| {
            if let Some(at) = at {
                let (v, n) = &mut acc[o];
                *v = if kind == PoolKind::Max { nan_max(*v, xin[at]) } else { *v + xin[at] };
                *n += 1;
            }
        });
        y.extend(acc.into_iter().map(|(v, n)| match kind {
            PoolKind::Max => v,
            PoolKind::Avg { count_include_pad: true } => v / taps as f64,
            PoolKind::Avg { count_include_pad: false } => v / n as f64,
        }));
    }
    y
}

impl Builder {
    /// The unfold of `x` `[N, C, *in]`: `[N, C, taps, *out]`, padding reading `value`.
    fn unfold(&mut self, x: NodeId, kernel: &[usize], w: &Window, out: &[Expr], value: f64) -> NodeId {
        let xs = self.shape(x);
        let taps: usize = kernel.iter().product();
        let identity = taps == 1 && w.stride.iter().all(|&s| s == 1) && w.padding.iter().all(|&(b, a)| b + a == 0);
        let mut dims = xs.dims()[..2].to_vec();
        dims.push(Expr::from(taps));
        dims.extend(out.iter().cloned());
        if identity {
            // A 1x1 window at stride 1 is the input itself: a reshape, so a GEMM reads it in place.
            return self.reshape(x, Shape(dims));
        }
        let op = Op::Unfold { kernel: kernel.to_vec(), window: w.clone(), value };
        self.push(op, &[x], self.dtype(x), Shape(dims))
    }

    /// A convolution as im2col plus one matmul per group, the batch folded into the product's columns:
    /// `[g, O/g, C/g*taps] @ [g, C/g*taps, N*P] -> [g, O/g, N*P]`, read back as `[N, O, *out]` through a
    /// permutation.
    ///
    /// Why the batch is folded: as `N` products of `P` columns each, a late layer of a CNN (DenseNet's
    /// fourth block: `P = 16`, `O = 32`) is a batch of products too small to fill a GPU, where one
    /// product of `N*P` columns is not. The im2col kernel writes its matrix in the folded order at no
    /// extra cost (the unfold is index arithmetic in that kernel anyway), a 1x1 convolution's input is
    /// written so by whichever kernel produces it, and every reader of the output reads the
    /// `[O, N, P]` product through the permutation's index expressions. The bias is added after the
    /// permutation (`add_channel_bias`), so it fuses into the result's readers.
    pub(crate) fn conv(
        &mut self,
        x: NodeId,
        w: NodeId,
        bias: Option<NodeId>,
        window: &Window,
        groups: usize,
    ) -> NodeId {
        if let Some(y) = (groups == 1).then(|| self.conv_by_rows(x, w, bias, window)).flatten() {
            return y;
        }
        let (xs, ws) = (self.shape(x), self.shape(w));
        let kernel = dims_of(&ws, 2);
        let r = kernel.len();
        let taps: usize = kernel.iter().product();
        let out: Vec<Expr> = (0..r).map(|a| window.out_len(a, &xs.dims()[a + 2], kernel[a])).collect();
        let dtype = self.dtype(x);
        let (n, o) = (xs.dims()[0].clone(), ws.dims()[0].clone());
        let cg = ws.dims()[1].clone();
        let g = Expr::from(groups);
        let og = o.clone().floor_div(&g);
        let positions = out.iter().fold(Expr::from(1usize), |p, d| p * d.clone());
        let columns = n.clone() * positions.clone();
        let depth = cg.clone() * taps as i64;
        let cols = self.unfold(x, &kernel, window, &out, 0.0);
        let cols = self.reshape(cols, Shape(vec![n.clone(), g.clone(), depth.clone(), positions.clone()]));
        let folded = Shape(vec![g.clone(), depth.clone(), n.clone(), positions.clone()]);
        let cols = self.push(Op::Permute { perm: vec![1, 2, 0, 3] }, &[cols], dtype, folded);
        let cols = self.reshape(cols, Shape(vec![g.clone(), depth.clone(), columns.clone()]));
        let wm = self.reshape(w, Shape(vec![g.clone(), og.clone(), depth]));
        let y = self.push(Op::MatMul, &[wm, cols], dtype, Shape(vec![g.clone(), og.clone(), columns]));
        let y = self.reshape(y, Shape(vec![g.clone(), og.clone(), n.clone(), positions.clone()]));
        let y =
            self.push(Op::Permute { perm: vec![2, 0, 1, 3] }, &[y], dtype, Shape(vec![n.clone(), g, og, positions]));
        let mut dims = vec![n, o];
        dims.extend(out);
        let y = self.reshape(y, Shape(dims));
        self.add_channel_bias(y, bias)
    }

    /// `y` `[N, O, *out]` plus `bias` `[O]` per channel, when there is one. Added to the convolution's
    /// result in its user-facing shape, the add fuses into whichever kernel reads the result (the
    /// library's epilogue adds only vectors along the product's rows, and the channels are its columns).
    fn add_channel_bias(&mut self, y: NodeId, bias: Option<NodeId>) -> NodeId {
        let Some(b) = bias else { return y };
        let dims = self.shape(y);
        let mut bd = vec![Expr::from(1usize); dims.rank()];
        bd[1] = dims.dims()[1].clone();
        let b = self.reshape(b, Shape(bd));
        let b = self.broadcast(b, &dims);
        self.add(y, b)
    }

    /// A stride-1 convolution as one product per kernel row, when the target asks for it
    /// (`Target::conv_row_products_bytes`) and the input is that large: only the last spatial axis is
    /// unfolded (with every axis's padding: `[C, k_last, N, *padded]`, written once by the kernel that
    /// produces the input), and the product of kernel row `t` reads that matrix from a shifted column
    /// offset, `t`'s rows down the padded grid. The products add up through the library's epilogue (each
    /// adds the previous sum as its residual); output positions on the padded grid's margins are computed
    /// and never read. A 3x3 kernel's matrix is then 3x the input, not 9x: DenseNet's first block spent
    /// most of its time writing and reading 9x im2col matrices.
    ///
    /// Only for one group (the caller's test). `None` (the full im2col) for strides, 1-D windows, symbolic dims, inputs below the
    /// threshold, and rows whose offsets would not start 16-byte aligned (the library's epilogue needs that
    /// to add the residual inside its call).
    fn conv_by_rows(&mut self, x: NodeId, w: NodeId, bias: Option<NodeId>, window: &Window) -> Option<NodeId> {
        let (xs, ws) = (self.shape(x), self.shape(w));
        let (xd, wd) = (xs.as_concrete()?, ws.as_concrete()?);
        let kernel = wd[2..].to_vec();
        let r = kernel.len();
        let last = r.checked_sub(1)?;
        let rows: usize = kernel[..last].iter().product();
        let dtype = self.dtype(x);
        let bytes = xd.iter().product::<usize>() * dtype.size_bytes();
        if self.conv_row_products_bytes == 0
            || (bytes as u64) < self.conv_row_products_bytes
            || rows < 2
            || window.stride.iter().any(|&s| s != 1)
        {
            return None;
        }
        // Leading axes: kernel 1 over their padding (the padded grid); the last: its own window.
        let mut unfold_kernel = vec![1; r];
        unfold_kernel[last] = kernel[last];
        let mut dilation = vec![1; r];
        dilation[last] = window.dilation[last];
        let unfold_window = Window { stride: vec![1; r], padding: window.padding.clone(), dilation };
        let grid: Vec<usize> = (0..r)
            .map(|a| unfold_window.out_len(a, &xs.dims()[a + 2], unfold_kernel[a]).as_const().map(|d| d as usize))
            .collect::<Option<_>>()?;
        let out: Vec<usize> = (0..r)
            .map(|a| window.out_len(a, &xs.dims()[a + 2], kernel[a]).as_const().map(|d| d as usize))
            .collect::<Option<_>>()?;
        if (grid[last] * dtype.size_bytes()) as i64 % crate::gemm::EPILOGUE_ALIGN_BYTES != 0 {
            return None;
        }
        let (n, c, o, kl) = (xd[0], xd[1], wd[0], kernel[last]);
        let (depth, columns) = (c * kl, n * grid.iter().product::<usize>());
        // Column offset of one step down leading axis `a` of the padded grid.
        let step: Vec<usize> = (0..last).map(|a| grid[a + 1..].iter().product()).collect();
        let span: usize = (0..last).map(|a| window.dilation[a] * (kernel[a] - 1) * step[a]).sum();
        let kept = columns - span;
        let dims = |v: &[usize]| Shape::from_dims(v);
        let unfold_dims: Vec<Expr> = grid.iter().map(|&d| Expr::from(d)).collect();
        let u = self.unfold(x, &unfold_kernel, &unfold_window, &unfold_dims, 0.0);
        let mut perm = vec![1, 2, 0];
        perm.extend(3..3 + r);
        let mut u_dims = vec![c, kl, n];
        u_dims.extend(&grid);
        let u = self.push(Op::Permute { perm }, &[u], dtype, dims(&u_dims));
        let u = self.reshape(u, dims(&[depth, columns]));
        // Weights row-major by kernel row: `[rows, O, C*k_last]`.
        let mut perm: Vec<usize> = (2..2 + last).collect();
        perm.extend([0, 1, 2 + last]);
        let mut wt_dims = kernel[..last].to_vec();
        wt_dims.extend([o, c, kl]);
        let wt = self.push(Op::Permute { perm }, &[w], self.dtype(w), dims(&wt_dims));
        let wt = self.reshape(wt, dims(&[rows, o, depth]));
        let slice = |b: &mut Builder, v: NodeId, axis: usize, start: usize, len: usize, to: Vec<usize>| {
            let op = Op::Slice { axis, start: Expr::from(start), end: Expr::from(start + len), step: 1 };
            b.push(op, &[v], b.dtype(v), dims(&to))
        };
        let mut sum: Option<NodeId> = None;
        for t in 0..rows {
            // `t` row-major over the leading kernel axes.
            let (mut rest, mut offset) = (t, 0);
            for a in (0..last).rev() {
                offset += (rest % kernel[a]) * window.dilation[a] * step[a];
                rest /= kernel[a];
            }
            let b_t = slice(self, u, 1, offset, kept, vec![depth, kept]);
            let a_t = slice(self, wt, 0, t, 1, vec![1, o, depth]);
            let a_t = self.reshape(a_t, dims(&[o, depth]));
            let p = self.push(Op::MatMul, &[a_t, b_t], dtype, dims(&[o, kept]));
            sum = Some(match sum {
                Some(prev) => self.add(p, prev),
                None => p,
            });
        }
        // Read back: the padded grid's columns, its margins dropped, `[N, O, *out]`.
        let y = self.push(Op::Pad { pads: vec![(0, 0), (0, span)], value: 0.0 }, &[sum?], dtype, dims(&[o, columns]));
        let mut y_dims = vec![o, n];
        y_dims.extend(&grid);
        let mut y = self.reshape(y, dims(&y_dims));
        for a in 0..last {
            if out[a] != grid[a] {
                y_dims[2 + a] = out[a];
                y = slice(self, y, 2 + a, 0, out[a], y_dims.clone());
            }
        }
        let mut perm = vec![1, 0];
        perm.extend(2..2 + r);
        let mut out_dims = vec![n, o];
        out_dims.extend(&out);
        let y = self.push(Op::Permute { perm }, &[y], dtype, dims(&out_dims));
        Some(self.add_channel_bias(y, bias))
    }

    /// Pooling as the elementwise max (or sum) of one strided slice per kernel tap; an average divides by
    /// the tap count, or by each window's in-bounds count (pooled the same way from ones) when padding is
    /// not counted.
    pub(crate) fn pool(&mut self, x: NodeId, kind: PoolKind, kernel: &[usize], window: &Window) -> NodeId {
        let xs = self.shape(x);
        let r = kernel.len();
        let out: Vec<Expr> = (0..r).map(|a| window.out_len(a, &xs.dims()[a + 2], kernel[a])).collect();
        // A max's padding is the dtype's lowest value (`-inf` for floats), which no window's max can be
        // below.
        let pad_value = if kind == PoolKind::Max { self.dtype(x).min_value() } else { 0.0 };
        let op = if kind == PoolKind::Max { ReduceOp::Max } else { ReduceOp::Sum };
        let pooled = |b: &mut Builder, src: NodeId| {
            let u = b.unfold(src, kernel, window, &out, pad_value);
            b.reduce(op, u, &[2], false)
        };
        let y = pooled(self, x);
        let PoolKind::Avg { count_include_pad } = kind else { return y };
        let taps: usize = kernel.iter().product();
        if count_include_pad || window.padding.iter().all(|&(b, a)| b + a == 0) {
            return self.scale(y, 1.0 / taps as f64);
        }
        // In-bounds counts depend only on the spatial position: pooled once at [1, 1, *in] and broadcast.
        let mut one_dims = vec![Expr::from(1usize); 2];
        one_dims.extend(xs.dims()[2..].iter().cloned());
        let ones = self.full(1.0, self.dtype(x), Shape(one_dims));
        let counts = pooled(self, ones);
        let counts = self.broadcast(counts, &self.shape(y));
        self.div(y, counts)
    }
}

impl PoolKind {
    /// The op's name, as in explain and kernel names.
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Max => "max_pool",
            PoolKind::Avg { .. } => "avg_pool",
        }
    }
}
