//! Optimizers as tensor code: an update is a function of the parameters, their gradients and the
//! optimizer's state that returns the new ones. Called eagerly it runs as a few fused kernels per
//! parameter; called inside a compiled train step (with [`crate::value_and_grad`]) it joins the step's
//! one graph, so every parameter's update fuses with its gradient's last kernel — the "fused multi-tensor
//! optimizer" falls out of the compiler rather than being written by hand.
//!
//! Quantities that change every step (AdamW's bias corrections, a scheduled learning rate) enter as
//! scalar tensors, never as constants: a constant would be baked into the graph and recompile it every
//! step. [`AdamWState::scalars`] makes them.

use crate::{DType, Error, Result, Tensor};

/// AdamW (Loshchilov & Hutter), as `torch.optim.AdamW` computes it: decoupled weight decay, bias-corrected
/// moments, `eps` added after the square root.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Learning rate (the peak one when a schedule scales it).
    pub lr: f64,
    /// Decay rates of the first and second moments.
    pub betas: (f64, f64),
    /// Added to the root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay (torch's default 0.01).
    pub weight_decay: f64,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW { lr: 1e-3, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 0.01 }
    }
}

/// AdamW's moments for each parameter, and the number of steps taken.
#[derive(Clone, Debug)]
pub struct AdamWState {
    /// First moments, one per parameter, on the parameter's device.
    pub m: Vec<Tensor>,
    /// Second moments.
    pub v: Vec<Tensor>,
    /// Steps taken so far.
    pub step: u64,
}

/// Zeros shaped like `t`, where `t` lives.
fn zeros_like(t: &Tensor) -> Result<Tensor> {
    let dims = t.shape().as_concrete().ok_or_else(|| Error::Unsupported {
        what: "optimizer state for a parameter of symbolic shape".into(),
        loc: crate::SourceLoc::internal(),
    })?;
    let z = Tensor::zeros(&dims, t.dtype())?;
    match t.value().and_then(|v| v.device()) {
        Some(d) => z.to(d.buffer.runtime().clone()),
        None => Ok(z),
    }
}

impl AdamWState {
    /// Zero moments for `params`, on their devices.
    pub fn new(params: &[Tensor]) -> Result<Self> {
        let m = params.iter().map(zeros_like).collect::<Result<Vec<_>>>()?;
        let v = params.iter().map(zeros_like).collect::<Result<Vec<_>>>()?;
        Ok(AdamWState { m, v, step: 0 })
    }

    /// The next step's scalars, `[lr · schedule, 1 / (1 − β₁ᵗ), 1 / (1 − β₂ᵗ)]` (f32, shape `[3]`), on
    /// `like`'s device; counts the step. `schedule` scales the learning rate (1.0 for none).
    pub fn scalars(&mut self, opt: &AdamW, schedule: f64, like: &Tensor) -> Result<Tensor> {
        self.step += 1;
        let t = self.step as i32;
        let v = [opt.lr * schedule, 1.0 / (1.0 - opt.betas.0.powi(t)), 1.0 / (1.0 - opt.betas.1.powi(t))];
        let s = Tensor::from_slice(&v.map(|x| x as f32), &[3])?;
        match like.value().and_then(|v| v.device()) {
            Some(d) => s.to(d.buffer.runtime().clone()),
            None => Ok(s),
        }
    }
}

impl AdamW {
    /// One update: returns `(params, m, v)` after the step. `scalars` is what [`AdamWState::scalars`]
    /// made for this step. Parameters and moments of a half dtype are updated in f32 and rounded back
    /// to their own dtypes (torch's AdamW keeps a bf16 parameter's moments bf16 and computes in f32).
    #[track_caller]
    pub fn update(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        m: &[Tensor],
        v: &[Tensor],
        scalars: &Tensor,
    ) -> Result<(Vec<Tensor>, Vec<Tensor>, Vec<Tensor>)> {
        check_lengths(params.len(), &[grads.len(), m.len(), v.len()])?;
        let (b1, b2) = self.betas;
        let lr = scalars.narrow(0, 0, 1)?.reshape(&[])?;
        let c1 = scalars.narrow(0, 1, 1)?.reshape(&[])?;
        let c2 = scalars.narrow(0, 2, 1)?.reshape(&[])?;
        let (mut ps, mut ms, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (((p, g), m), v) in params.iter().zip(grads).zip(m).zip(v) {
            let dtype = p.dtype();
            let (p32, g) = (p.cast(DType::F32)?, g.cast(DType::F32)?);
            let (m_dtype, v_dtype) = (m.dtype(), v.dtype());
            let m = m.cast(DType::F32)?.mul(b1)?.add(&g.mul(1.0 - b1)?)?;
            let v = v.cast(DType::F32)?.mul(b2)?.add(&g.mul(&g)?.mul(1.0 - b2)?)?;
            let step = m.mul(&c1)?.div(&v.mul(&c2)?.sqrt()?.add(self.eps)?)?;
            let decayed = p32.sub(&p32.mul(&lr)?.mul(self.weight_decay)?)?;
            ps.push(decayed.sub(&step.mul(&lr)?)?.cast(dtype)?);
            ms.push(m.cast(m_dtype)?);
            vs.push(v.cast(v_dtype)?);
        }
        Ok((ps, ms, vs))
    }
}

/// Stochastic gradient descent with momentum, Nesterov momentum and (coupled) weight decay, as
/// `torch.optim.SGD` computes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0: plain SGD, no state).
    pub momentum: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
}

impl Sgd {
    /// One update: returns `(params, momentum buffers)`. `buffers` are the previous momentum buffers
    /// (zeros before the first step, as [`AdamWState::new`]'s moments are); ignored without momentum.
    pub fn update(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        buffers: &[Tensor],
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        check_lengths(params.len(), &[grads.len(), buffers.len()])?;
        let (mut ps, mut bs) = (Vec::new(), Vec::new());
        for ((p, g), b) in params.iter().zip(grads).zip(buffers) {
            let mut g = g.clone();
            if self.weight_decay != 0.0 {
                g = g.add(&p.mul(self.weight_decay)?)?;
            }
            let mut buf = b.clone();
            if self.momentum != 0.0 {
                buf = b.mul(self.momentum)?.add(&g)?;
                g = if self.nesterov { g.add(&buf.mul(self.momentum)?)? } else { buf.clone() };
            }
            ps.push(p.sub(&g.mul(self.lr)?)?);
            bs.push(buf);
        }
        Ok((ps, bs))
    }
}

/// Scales `grads` so their global L2 norm is at most `max_norm` (as `clip_grad_norm_`); returns the
/// clipped gradients and the norm before clipping.
pub fn clip_grad_norm(grads: &[Tensor], max_norm: f64) -> Result<(Vec<Tensor>, Tensor)> {
    let mut total: Option<Tensor> = None;
    for g in grads {
        let g = g.cast(DType::F32)?;
        let axes: Vec<isize> = (0..g.rank() as isize).collect();
        let s = g.mul(&g)?.sum(&axes, false)?;
        total = Some(match total {
            Some(t) => t.add(&s)?,
            None => s,
        });
    }
    let norm = match total {
        Some(t) => t.sqrt()?,
        None => Tensor::scalar(0.0, DType::F32)?,
    };
    // min(1, max_norm / (norm + 1e-6)), torch's formula.
    let scale = norm.add(1e-6)?.reciprocal()?.mul(max_norm)?.minimum(1.0)?;
    let clipped = grads.iter().map(|g| g.mul(&scale.cast(g.dtype())?)).collect::<Result<Vec<_>>>()?;
    Ok((clipped, norm))
}

/// Learning-rate factor of a linear warmup then cosine decay to `floor` (a fraction of the peak), for
/// step `step` (from 1) of `total`.
pub fn warmup_cosine(step: u64, warmup: u64, total: u64, floor: f64) -> f64 {
    if step <= warmup {
        return step as f64 / warmup.max(1) as f64;
    }
    let done = (step - warmup) as f64 / (total.saturating_sub(warmup)).max(1) as f64;
    floor + (1.0 - floor) * 0.5 * (1.0 + (std::f64::consts::PI * done.min(1.0)).cos())
}

#[track_caller]
fn check_lengths(n: usize, others: &[usize]) -> Result<()> {
    if others.iter().any(|&k| k != n) {
        return Err(Error::Unsupported {
            what: format!(
                "an optimizer update needs one gradient and one state per parameter: {n} parameters, {others:?}"
            ),
            loc: crate::SourceLoc::caller(),
        });
    }
    Ok(())
}
