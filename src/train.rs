//! A compiled AdamW training loop in a few lines: [`Trainer`] holds a model's parameters and the
//! optimizer's moments on the device, and [`Trainer::step`] runs one compiled step — forward, loss,
//! backward ([`crate::value_and_grad`]) and the AdamW update — traced and fused as one graph, so a step
//! is one call with no host round trip (the loss stays on the device until read).
//!
//! Mixed precision: a model whose parameters are bf16 or f16 trains on f32 master weights (updates far
//! below a half's resolution accumulate there); the step computes the forward and backward in the
//! model's dtypes from the masters rounded down, and hands back both the masters and the rounded
//! parameters. An f16 model's step also scales its loss dynamically ([`crate::loss_scale`]): its
//! gradients would otherwise flush to zero below f16's range; a step that overflows is skipped on the
//! device.

use crate::loss_scale::{self, LossScale, LossScaleState};
use crate::nn::Module;
use crate::optim::{AdamW, AdamWState};
use crate::{compile, Compiled, DType, Result, Tensor};

/// A compiled-step function: the whole argument list in, the whole result list out.
pub trait StepFn: Fn(Vec<Tensor>) -> Result<Vec<Tensor>> {}

impl<F: Fn(Vec<Tensor>) -> Result<Vec<Tensor>>> StepFn for F {}

/// The model's parameter dtypes, and whether it trains on f32 master weights.
fn precision<M: Module>(model: &M) -> (Vec<DType>, bool) {
    let dtypes: Vec<DType> = model.tensors().iter().map(Tensor::dtype).collect();
    let mixed = dtypes.iter().any(|d| matches!(d, DType::BF16 | DType::F16));
    (dtypes, mixed)
}

/// The loss scaling a model trains with by default: dynamic for an f16 model, none otherwise.
fn default_scaling<M: Module>(model: &M) -> Option<LossScale> {
    model.tensors().iter().any(|t| t.dtype() == DType::F16).then(LossScale::default)
}

/// The step function a [`Trainer`] compiles: over `[weights…, m…, v…, scalars, batch…]`, returns
/// `[loss, weights…, m…, v…]` after one AdamW update of `model`'s parameters against `loss(model, batch)`,
/// and, for a half-precision model, its parameters rounded from the new f32 master weights after those.
/// `weights` are the parameters themselves, or for a half-precision model their f32 masters. An f16
/// model's step scales its loss ([`adamw_step_scaled`] with [`LossScale::default`]).
pub fn adamw_step<M: Module + Clone>(
    model: &M,
    opt: AdamW,
    loss: impl Fn(&M, &[Tensor]) -> Result<Tensor>,
) -> impl StepFn {
    adamw_step_scaled(model, opt, default_scaling(model), loss)
}

/// [`adamw_step`] with the loss scaling given (`None`: none). With scaling, the arguments take the
/// scaler's state after `scalars` (`[…, scalars, state, batch…]`, see [`LossScale::initial_state`]) and
/// the results its next state after the moments (`[loss, weights…, m…, v…, state, params…]`); the
/// loss returned is unscaled, and `scalars`' bias corrections are replaced by the state's own (they
/// count applied updates, which only the device knows).
pub fn adamw_step_scaled<M: Module + Clone>(
    model: &M,
    opt: AdamW,
    scaling: Option<LossScale>,
    loss: impl Fn(&M, &[Tensor]) -> Result<Tensor>,
) -> impl StepFn {
    let n = model.tensors().len();
    let (dtypes, mixed) = precision(model);
    let shape = model.clone();
    let rounded = move |w: &[Tensor]| -> Result<Vec<Tensor>> {
        w.iter().zip(&dtypes).map(|(w, &d)| if w.dtype() == d { Ok(w.clone()) } else { w.cast(d) }).collect()
    };
    let extra = usize::from(scaling.is_some());
    move |t: Vec<Tensor>| {
        if t.len() < 3 * n + 1 + extra {
            return Err(crate::Error::Unsupported {
                what: format!(
                    "a train step of {n} parameters takes at least {} tensors, got {}",
                    3 * n + 1 + extra,
                    t.len()
                ),
                loc: crate::SourceLoc::internal(),
            });
        }
        let (weights, rest) = t.split_at(n);
        let (m, rest) = rest.split_at(n);
        let (v, rest) = rest.split_at(n);
        let (scalars, rest) = (&rest[0], &rest[1..]);
        let (state, batch) = rest.split_at(extra);
        let wrt: Vec<usize> = (0..n).collect();
        // With loss scaling, the scale is an argument after the weights (data, not a constant).
        let scale = state.first().map(loss_scale::scale_of).transpose()?;
        let args: Vec<Tensor> = weights.iter().chain(&scale).chain(batch).cloned().collect();
        // Gradients with respect to the weights themselves: through the rounding casts, in f32.
        let (value, grads) = crate::value_and_grad(
            |a| {
                let l = loss(&shape.load(&rounded(&a[..n])?)?, &a[n + extra..])?;
                if extra == 0 {
                    return Ok(l);
                }
                l.cast(DType::F32)?.mul(&a[n])
            },
            &args,
            &wrt,
        )?;
        let (Some(cfg), Some(state), Some(scale)) = (scaling, state.first(), scale) else {
            let (w, m, v) = opt.update(weights, &grads, m, v, scalars)?;
            let params = if mixed { rounded(&w)? } else { Vec::new() };
            return Ok([vec![value], w, m, v, params].concat());
        };
        let inverse = scale.reciprocal()?;
        let grads = grads.iter().map(|g| g.cast(DType::F32)?.mul(&inverse)).collect::<Result<Vec<_>>>()?;
        let overflow = loss_scale::found_overflow(&grads)?;
        let [c1, c2] = loss_scale::bias_corrections(opt.betas, state)?;
        let lr = scalars.narrow(0, 0, 1)?;
        let own = Tensor::concat(&[&lr, &c1.reshape(&[1])?, &c2.reshape(&[1])?], 0)?;
        let (w, m2, v2) = opt.update(weights, &grads, m, v, &own)?;
        // A step that overflowed keeps every value it was given (torch skips `optimizer.step()`).
        let ok = overflow.eq(0.0)?;
        let keep = |new: Vec<Tensor>, old: &[Tensor]| -> Result<Vec<Tensor>> {
            new.iter().zip(old).map(|(a, b)| ok.where_(a, b)).collect()
        };
        let (w, m2, v2) = (keep(w, weights)?, keep(m2, m)?, keep(v2, v)?);
        let next = loss_scale::next_state(&cfg, opt.betas, state, &overflow)?;
        let params = if mixed { rounded(&w)? } else { Vec::new() };
        Ok([vec![value.mul(&inverse)?], w, m2, v2, vec![next], params].concat())
    }
}

/// A model, its AdamW state (and f32 master weights for a half-precision model), and its compiled step.
pub struct Trainer<M, F> {
    model: M,
    masters: Option<Vec<Tensor>>,
    opt: AdamW,
    state: AdamWState,
    /// The loss scaler's device state, when the model trains with one.
    scaler: Option<Tensor>,
    step: Compiled<F>,
}

impl<M: Module + Clone> Trainer<M, ()> {
    /// A trainer of `model` (its parameters where they are: move the model to a device first) by `opt`
    /// against `loss(model, batch)`, compiled for `backend`. An f16 model's loss is scaled dynamically
    /// with [`LossScale::default`]; [`Trainer::with_loss_scale`] chooses otherwise.
    #[allow(clippy::new_ret_no_self)]
    pub fn new<L>(
        model: M,
        opt: AdamW,
        loss: L,
        backend: impl crate::graph::IntoBackend,
    ) -> Result<Trainer<M, impl StepFn>>
    where
        L: Fn(&M, &[Tensor]) -> Result<Tensor>,
    {
        let scaling = default_scaling(&model);
        Trainer::with_loss_scale(model, opt, scaling, loss, backend)
    }

    /// [`Trainer::new`] with the loss scaling given (`None`: the loss unscaled, whatever the dtype).
    pub fn with_loss_scale<L>(
        model: M,
        opt: AdamW,
        scaling: Option<LossScale>,
        loss: L,
        backend: impl crate::graph::IntoBackend,
    ) -> Result<Trainer<M, impl StepFn>>
    where
        L: Fn(&M, &[Tensor]) -> Result<Tensor>,
    {
        let (_, mixed) = precision(&model);
        let masters = if mixed {
            Some(model.tensors().iter().map(|p| p.cast(DType::F32)).collect::<Result<Vec<_>>>()?)
        } else {
            None
        };
        let weights = masters.clone().unwrap_or_else(|| model.tensors());
        let state = AdamWState::new(&weights)?;
        let scaler = match (scaling, weights.first()) {
            (Some(cfg), Some(like)) => Some(cfg.initial_state(like)?),
            _ => None,
        };
        let step = compile(adamw_step_scaled(&model, opt, scaling, loss)).backend(backend);
        Ok(Trainer { model, masters, opt, state, scaler, step })
    }
}

impl<M: Module, F: StepFn> Trainer<M, F> {
    /// One step on `batch` with the learning rate scaled by `lr_scale` (a schedule's factor, 1.0 for
    /// none); returns the loss before the update, still on the device.
    pub fn step(&mut self, batch: &[Tensor], lr_scale: f64) -> Result<Tensor> {
        let weights = self.masters.clone().unwrap_or_else(|| self.model.tensors());
        let n = weights.len();
        let anchor = weights.first().cloned().ok_or_else(|| crate::Error::Unsupported {
            what: "a model without parameters".into(),
            loc: crate::SourceLoc::internal(),
        })?;
        let scalars = self.state.scalars(&self.opt, lr_scale, &anchor)?;
        let scaler: Vec<Tensor> = self.scaler.iter().cloned().collect();
        let args: Vec<Tensor> =
            [weights, self.state.m.clone(), self.state.v.clone(), vec![scalars], scaler, batch.to_vec()].concat();
        let out: Vec<Tensor> = self.step.call(args)?;
        let (loss, rest) = out.split_first().expect("a step returns its loss first");
        let (w, rest) = rest.split_at(n);
        let (m, rest) = rest.split_at(n);
        let (v, rest) = rest.split_at(n);
        let (scaler, params) = rest.split_at(usize::from(self.scaler.is_some()));
        if let Some(s) = scaler.first() {
            self.scaler = Some(s.clone());
        }
        match &mut self.masters {
            Some(masters) => {
                *masters = w.to_vec();
                self.model = self.model.load(params)?;
            }
            None => self.model = self.model.load(w)?,
        }
        self.state.m = m.to_vec();
        self.state.v = v.to_vec();
        Ok(loss.clone())
    }

    /// The model as trained so far.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The f32 master weights of a half-precision model (`None` for an f32 model).
    pub fn masters(&self) -> Option<&[Tensor]> {
        self.masters.as_deref()
    }

    /// Steps taken (calls of [`Trainer::step`], skipped ones included).
    pub fn steps(&self) -> u64 {
        self.state.step
    }

    /// The loss scaler's state, read back from the device (a sync); `None` without loss scaling.
    pub fn loss_scale(&self) -> Result<Option<LossScaleState>> {
        self.scaler.as_ref().map(LossScale::read).transpose()
    }

    /// What the compiled step did (traces, cache hits, recompiles).
    pub fn stats(&self) -> crate::CompileStats {
        self.step.stats()
    }
}
