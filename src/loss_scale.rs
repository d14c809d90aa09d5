//! Dynamic loss scaling for f16 training, as torch's `GradScaler` does it, but on the device.
//!
//! f16's smallest normal is 6e-5: small gradients flushed to zero stop a model from learning. Scaling the
//! loss by S (2¹⁶ to start) scales every gradient by S through the backward pass; the update divides them
//! back in f32. A step whose gradients overflowed (inf or NaN anywhere) is skipped — parameters and
//! moments keep their values — and S halves; after `interval` good steps in a row S doubles.
//!
//! torch's scaler reads its overflow flag back to the host every step (`found_inf.item()`) to decide
//! whether to call the optimizer. Here the decision is a `where` in the compiled step: the scaler's state
//! is a device tensor the step reads and rewrites, AdamW's bias corrections come from it (a skipped step
//! does not count, as in torch), and nothing is read back unless the user asks
//! ([`crate::train::Trainer::loss_scale`]).

use crate::{DType, Result, Tensor};

/// How the loss scale moves (torch's `GradScaler` defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScale {
    /// The first scale.
    pub init: f64,
    /// Factor after `interval` steps in a row without overflow.
    pub growth: f64,
    /// Factor after a step that overflowed (and was skipped).
    pub backoff: f64,
    /// Good steps in a row before the scale grows.
    pub interval: u32,
}

impl Default for LossScale {
    fn default() -> Self {
        LossScale { init: 65536.0, growth: 2.0, backoff: 0.5, interval: 2000 }
    }
}

/// The scaler's state as the host sees it when it asks (one read back from the device).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaleState {
    /// The scale the next step multiplies the loss by.
    pub scale: f64,
    /// Steps without overflow since the last change of scale.
    pub good_steps: u64,
    /// Optimizer updates applied (calls minus skipped steps).
    pub updates: u64,
}

/// The state tensor's layout (f32 `[5]`): the scale, good steps in a row, updates applied, and
/// `1 − β₁ᵗ`, `1 − β₂ᵗ` for `t` updates. The last two are carried rather than computed from `t`:
/// `1 − exp(t·ln 0.999)` in f32 loses four digits to cancellation at `t = 1`, while the recurrence
/// `q ← q + (1 − q)(1 − β)` is exact to a few roundings at every `t`.
const STATE: usize = 5;

impl LossScale {
    /// The scaler's first state (see [`STATE`]), on `like`'s device.
    pub fn initial_state(&self, like: &Tensor) -> Result<Tensor> {
        let s = Tensor::from_slice(&[self.init as f32, 0.0, 0.0, 0.0, 0.0], &[STATE])?;
        match like.value().and_then(|v| v.device()) {
            Some(d) => s.to(d.buffer.runtime().clone()),
            None => Ok(s),
        }
    }

    /// Reads a state tensor back (a device sync).
    pub fn read(state: &Tensor) -> Result<LossScaleState> {
        let v = state.to_data()?.values().to_vec();
        Ok(LossScaleState { scale: v[0], good_steps: v[1] as u64, updates: v[2] as u64 })
    }
}

/// The state's scalars (each shape `[]`), in [`STATE`]'s order.
fn unpack(state: &Tensor) -> Result<Vec<Tensor>> {
    (0..STATE).map(|i| state.narrow(0, i, 1)?.reshape(&[])).collect()
}

/// The scale (f32 `[]`) the step multiplies its loss by.
pub(crate) fn scale_of(state: &Tensor) -> Result<Tensor> {
    state.narrow(0, 0, 1)?.reshape(&[])
}

/// 1 (f32, shape `[]`) when any gradient holds an inf or a NaN, else 0.
pub(crate) fn found_overflow(grads: &[Tensor]) -> Result<Tensor> {
    let mut found = Tensor::scalar(0.0, DType::F32)?;
    for g in grads {
        let g = g.cast(DType::F32)?;
        let bad = g.abs()?.gt(f32::MAX as f64)?.logical_or(&g.isnan()?)?.cast(DType::F32)?;
        let axes: Vec<isize> = (0..g.rank() as isize).collect();
        found = found.maximum(&bad.max(&axes, false)?)?;
    }
    Ok(found)
}

/// `1 − βᵗ⁺¹` from `q = 1 − βᵗ`.
fn next_q(q: &Tensor, beta: f64) -> Result<Tensor> {
    q.add(&q.neg()?.add(1.0)?.mul(1.0 - beta)?)
}

/// AdamW's bias corrections `[1 / (1 − β₁ᵗ), 1 / (1 − β₂ᵗ)]` (f32 `[]` each) for the step about to be
/// applied (`t` one past the state's updates).
pub(crate) fn bias_corrections(betas: (f64, f64), state: &Tensor) -> Result<[Tensor; 2]> {
    let s = unpack(state)?;
    Ok([next_q(&s[3], betas.0)?.reciprocal()?, next_q(&s[4], betas.1)?.reciprocal()?])
}

/// The state after a step: the scale backs off on overflow and grows after `interval` good steps in a
/// row; the update count and the bias-correction terms advance only when the step was applied.
/// `overflow` is [`found_overflow`]'s flag.
pub(crate) fn next_state(cfg: &LossScale, betas: (f64, f64), state: &Tensor, overflow: &Tensor) -> Result<Tensor> {
    let s = unpack(state)?;
    let ok = overflow.eq(0.0)?;
    let good_next = s[1].add(1.0)?;
    let grow = good_next.ge(cfg.interval as f64)?;
    let scale = ok.where_(&grow.where_(&s[0].mul(cfg.growth)?, &s[0])?, &s[0].mul(cfg.backoff)?)?;
    let good = ok.where_(&grow.where_(0.0, &good_next)?, 0.0)?;
    let updates = s[2].add(&ok.cast(DType::F32)?)?;
    let q1 = ok.where_(&next_q(&s[3], betas.0)?, &s[3])?;
    let q2 = ok.where_(&next_q(&s[4], betas.1)?, &s[4])?;
    let parts = [scale, good, updates, q1, q2].map(|t| t.reshape(&[1]));
    let parts = parts.into_iter().collect::<Result<Vec<_>>>()?;
    Tensor::concat(&parts.iter().collect::<Vec<_>>(), 0)
}
