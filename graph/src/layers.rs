//! Normalisation layers and activations with `torch.nn.functional`'s names, arguments and defaults,
//! composed of kiln's ops: every backend, the f64 reference and autodiff get them with nothing new to
//! lower, and fusion makes each one or two kernels. Every node a layer records is attributed to the
//! user's line that called it ([`SourceLoc::attributed`]), as a single op would be. The ONNX importer
//! builds its BatchNormalization, InstanceNormalization, GroupNormalization and activations from these.

use crate::error::{Error, Result};
use crate::loc::SourceLoc;
use crate::shape::Dim;
use crate::trace::Tensor;

/// A per-channel parameter (`[C]`) viewed to broadcast over `[N, C, ...]` of rank `rank`, after
/// checking it has `c` elements.
fn per_channel(op: &str, what: &str, p: &Tensor, c: &Dim, rank: usize) -> Result<Tensor> {
    let dims = p.shape();
    if dims.dims() != std::slice::from_ref(c) {
        return Err(Error::Shape {
            op: op.into(),
            msg: format!("{what} has shape {dims}; one value per channel ([{c}]) was expected"),
            loc: SourceLoc::caller(),
        });
    }
    let mut view = vec![-1isize];
    view.extend(std::iter::repeat_n(1, rank.saturating_sub(2)));
    p.reshape(&view)
}

/// `x`'s channel count (axis 1), after checking `x` has at least `min_rank` axes.
fn channels(op: &str, x: &Tensor, min_rank: usize) -> Result<Dim> {
    let s = x.shape();
    if s.rank() < min_rank {
        return Err(Error::Shape {
            op: op.into(),
            msg: format!("input {s} needs at least {min_rank} axes ([N, C, ...])"),
            loc: SourceLoc::caller(),
        });
    }
    Ok(s.dims()[1].clone())
}

/// `x * weight + bias` over channels, each where given.
fn affine(op: &str, x: Tensor, weight: Option<&Tensor>, bias: Option<&Tensor>, c: &Dim) -> Result<Tensor> {
    let r = x.rank();
    let mut y = x;
    if let Some(w) = weight {
        y = y.mul(&per_channel(op, "weight", w, c, r)?)?;
    }
    if let Some(b) = bias {
        y = y.add(&per_channel(op, "bias", b, c, r)?)?;
    }
    Ok(y)
}

/// `(x - mean) / sqrt(var + eps)` over `axes` (biased variance, as torch's normalisation layers use).
fn normalize(x: &Tensor, axes: &[isize], eps: f64) -> Result<Tensor> {
    let mean = x.mean(axes, true)?;
    let d = x.sub(&mean)?;
    let var = d.mul(&d)?.mean(axes, true)?;
    d.mul(&var.add(eps)?.rsqrt()?)
}

impl Tensor {
    /// Batch normalisation with running statistics (`torch.nn.functional.batch_norm(x, running_mean,
    /// running_var, weight, bias, training=False, eps=eps)`): channel axis 1, parameters `[C]`. The
    /// per-channel factor is computed on the `[C]` parameters, so each element costs a subtract and a
    /// multiply-add.
    #[track_caller]
    pub fn batch_norm(
        &self,
        running_mean: &Tensor,
        running_var: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        SourceLoc::attributed(SourceLoc::caller(), || {
            let c = channels("batch_norm", self, 2)?;
            let r = self.rank();
            let mean = per_channel("batch_norm", "running_mean", running_mean, &c, r)?;
            let mut scale = per_channel("batch_norm", "running_var", running_var, &c, r)?.add(eps)?.rsqrt()?;
            if let Some(w) = weight {
                scale = scale.mul(&per_channel("batch_norm", "weight", w, &c, r)?)?;
            }
            let y = self.sub(&mean)?.mul(&scale)?;
            affine("batch_norm", y, None, bias, &c)
        })
    }

    /// Instance normalisation (`torch.nn.functional.instance_norm` with no running statistics): each
    /// sample's each channel normalised over its spatial axes, then `weight` and `bias` (`[C]`) if given.
    #[track_caller]
    pub fn instance_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        SourceLoc::attributed(SourceLoc::caller(), || {
            let c = channels("instance_norm", self, 3)?;
            let axes: Vec<isize> = (2..self.rank() as isize).collect();
            affine("instance_norm", normalize(self, &axes, eps)?, weight, bias, &c)
        })
    }

    /// Group normalisation (`torch.nn.functional.group_norm(x, groups, weight, bias, eps)`): the
    /// channels split into `groups` groups, each normalised with its spatial axes, then per-channel
    /// `weight` and `bias` (`[C]`) if given. The channel count must be a constant multiple of `groups`;
    /// the batch or the spatial size may be symbolic, not both.
    #[track_caller]
    pub fn group_norm(
        &self,
        groups: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        SourceLoc::attributed(SourceLoc::caller(), || {
            let c = channels("group_norm", self, 2)?;
            let n = c.as_const().filter(|&n| groups >= 1 && n % groups as i64 == 0).ok_or_else(|| Error::Shape {
                op: "group_norm".into(),
                msg: format!("{c} channels do not split into {groups} groups"),
                loc: SourceLoc::caller(),
            })?;
            let dims = self.shape();
            // [N, G, C/G * spatial]: each group's values along one axis; at most one size inferred.
            let known = |d: &Dim| d.as_const().map(|v| v as isize);
            let spatial: Option<isize> = dims.dims()[2..].iter().map(known).product();
            let batch = known(&dims.dims()[0]);
            let per_group = spatial.map(|s| s * (n / groups as i64) as isize);
            let (grouped, back): (Vec<isize>, Vec<isize>) = match (batch, per_group) {
                (Some(b), _) => (vec![b, groups as isize, -1], self.shape().view_dims()),
                (None, Some(k)) => (vec![-1, groups as isize, k], self.shape().view_dims()),
                (None, None) => {
                    return Err(Error::Shape {
                        op: "group_norm".into(),
                        msg: format!("input {dims}: a symbolic batch and symbolic spatial sizes at once"),
                        loc: SourceLoc::caller(),
                    })
                }
            };
            let y = normalize(&self.reshape(&grouped)?, &[2], eps)?.reshape(&back)?;
            affine("group_norm", y, weight, bias, &c)
        })
    }

    /// `x` where positive, `negative_slope * x` elsewhere (`torch.nn.functional.leaky_relu`).
    #[track_caller]
    pub fn leaky_relu(&self, negative_slope: f64) -> Result<Tensor> {
        SourceLoc::attributed(SourceLoc::caller(), || self.lt(0.0)?.where_(self.mul(negative_slope)?, self))
    }

    /// `x` where positive, `alpha * (exp(x) - 1)` elsewhere (`torch.nn.functional.elu`).
    #[track_caller]
    pub fn elu(&self, alpha: f64) -> Result<Tensor> {
        SourceLoc::attributed(SourceLoc::caller(), || {
            // exp of min(x, 0): the branch `where` does not pick still gets a gradient, and exp of a
            // large positive x would make it 0 · inf = NaN.
            let neg = self.minimum(0.0)?.exp()?.sub(1.0)?.mul(alpha)?;
            self.lt(0.0)?.where_(neg, self)
        })
    }

    /// `min(max(x + 3, 0), 6) / 6` (`torch.nn.functional.hardsigmoid`).
    #[track_caller]
    pub fn hardsigmoid(&self) -> Result<Tensor> {
        SourceLoc::attributed(SourceLoc::caller(), || self.div(6.0)?.add(0.5)?.minimum(1.0)?.maximum(0.0))
    }

    /// `x * hardsigmoid(x)` (`torch.nn.functional.hardswish`).
    #[track_caller]
    pub fn hardswish(&self) -> Result<Tensor> {
        SourceLoc::attributed(SourceLoc::caller(), || self.mul(&self.hardsigmoid()?))
    }

    /// `x` where positive, `weight * x` elsewhere, with one slope (`[1]`) or one per channel (`[C]`,
    /// channel axis 1) (`torch.nn.functional.prelu`).
    #[track_caller]
    pub fn prelu(&self, weight: &Tensor) -> Result<Tensor> {
        SourceLoc::attributed(SourceLoc::caller(), || {
            let slope = match weight.shape().dims() {
                [one] if one.as_const() == Some(1) => weight.clone(),
                _ => per_channel("prelu", "weight", weight, &channels("prelu", self, 2)?, self.rank())?,
            };
            self.lt(0.0)?.where_(self.mul(&slope)?, self)
        })
    }

    /// `x` limited to `[min, max]` (either bound optional; `torch.clamp`); NaN stays NaN.
    #[track_caller]
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        SourceLoc::attributed(SourceLoc::caller(), || {
            let mut y = self.clone();
            if let Some(lo) = min {
                y = y.maximum(lo)?;
            }
            if let Some(hi) = max {
                y = y.minimum(hi)?;
            }
            Ok(y)
        })
    }
}

/// How [`Tensor::pad_with`] fills the border (`torch.nn.functional.pad`'s modes; ONNX `Pad`'s
/// `constant`, `reflect`, `edge`, `wrap`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PadMode {
    /// Every new element is this value.
    Constant(f64),
    /// Mirrored without repeating the edge: `[a b c]` padded by 2 → `c b [a b c] b a`. Each pad must be
    /// below the axis's size.
    Reflect,
    /// The edge element repeated: `a a [a b c] c c`.
    Replicate,
    /// Wrapped around: `b c [a b c] a b`. Each pad must be at most the axis's size.
    Circular,
}

impl Tensor {
    /// Pads axis `i` by `pads[i] = (before, after)`, from the first axis (as [`Tensor::pad`]; fewer entries
    /// than the rank pad the leading axes only), filling as `mode` says. Reflect, replicate and
    /// circular padding are slices of `x` joined to it (flipped where reflected), so a convolution with
    /// `padding_mode='reflect'` is `x.pad_with(.., PadMode::Reflect)?.conv(..)`. Padded axes must have
    /// constant sizes.
    #[track_caller]
    pub fn pad_with(&self, pads: &[(usize, usize)], mode: PadMode) -> Result<Tensor> {
        let loc = SourceLoc::caller();
        if let PadMode::Constant(v) = mode {
            return SourceLoc::attributed(loc, || self.pad(pads, v));
        }
        SourceLoc::attributed(loc, || {
            let bad = |msg: String| Error::Shape { op: "pad".into(), msg, loc: SourceLoc::caller() };
            if pads.len() > self.rank() {
                return Err(bad(format!("{} pads for a rank-{} tensor", pads.len(), self.rank())));
            }
            let mut x = self.clone();
            for (a, &(before, after)) in pads.iter().enumerate() {
                if before == 0 && after == 0 {
                    continue;
                }
                let n = x.shape().dims()[a].as_const().ok_or_else(|| bad(format!("axis {a} has a symbolic size")))?
                    as usize;
                let fits = match mode {
                    PadMode::Reflect => before < n && after < n,
                    PadMode::Circular => before <= n && after <= n,
                    _ => n >= 1,
                };
                if !fits {
                    return Err(bad(format!("{mode:?} padding ({before}, {after}) of axis {a} of size {n}")));
                }
                let ax = a as isize;
                let part = |start: usize, len: usize| x.narrow(ax, start, len);
                let (head, tail) = match mode {
                    PadMode::Reflect => (flip(&part(1, before)?, ax)?, flip(&part(n - 1 - after, after)?, ax)?),
                    PadMode::Circular => (part(n - before, before)?, part(0, after)?),
                    _ => (repeat(&part(0, 1)?, ax, before)?, repeat(&part(n - 1, 1)?, ax, after)?),
                };
                let pieces: Vec<&Tensor> =
                    [&head, &x, &tail].into_iter().filter(|t| t.shape().dims()[a].as_const() != Some(0)).collect();
                x = Tensor::concat(&pieces, ax)?;
            }
            Ok(x)
        })
    }
}

/// `x` reversed along axis `a` (a gather of the indices `n-1 .. 0`).
fn flip(x: &Tensor, a: isize) -> Result<Tensor> {
    let n = x.shape().dims()[a as usize].as_const().unwrap_or(0);
    if n <= 1 {
        return Ok(x.clone());
    }
    x.index_select(a, &Tensor::arange((n - 1) as f64, -1.0, -1.0, crate::DType::I64)?)
}

/// A size-1 slice `x` repeated `k` times along axis `a` (a broadcast).
fn repeat(x: &Tensor, a: isize, k: usize) -> Result<Tensor> {
    let mut dims = x.shape().view_dims();
    dims[a as usize] = k as isize;
    x.expand(&dims)
}
