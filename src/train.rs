//! A compiled AdamW training loop in a few lines: [`Trainer`] holds a model's parameters and the
//! optimizer's moments on the device, and [`Trainer::step`] runs one compiled step — forward, loss,
//! backward ([`crate::value_and_grad`]) and the AdamW update — traced and fused as one graph, so a step
//! is one call with no host round trip (the loss stays on the device until read).
//!
//! Mixed precision: a model whose parameters are bf16 or f16 trains on f32 master weights (updates far
//! below a half's resolution accumulate there); the step computes the forward and backward in the
//! model's dtypes from the masters rounded down, and hands back both the masters and the rounded
//! parameters. f16 models get no loss scaling yet: train them in bf16.

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

/// The step function a [`Trainer`] compiles: over `[weights…, m…, v…, scalars, batch…]`, returns
/// `[loss, weights…, m…, v…]` after one AdamW update of `model`'s parameters against `loss(model, batch)`,
/// and, for a half-precision model, its parameters rounded from the new f32 master weights after those.
/// `weights` are the parameters themselves, or for a half-precision model their f32 masters.
pub fn adamw_step<M: Module + Clone>(
    model: &M,
    opt: AdamW,
    loss: impl Fn(&M, &[Tensor]) -> Result<Tensor>,
) -> impl StepFn {
    let n = model.tensors().len();
    let (dtypes, mixed) = precision(model);
    let shape = model.clone();
    let rounded = move |w: &[Tensor]| -> Result<Vec<Tensor>> {
        w.iter().zip(&dtypes).map(|(w, &d)| if w.dtype() == d { Ok(w.clone()) } else { w.cast(d) }).collect()
    };
    move |t: Vec<Tensor>| {
        if t.len() < 3 * n + 1 {
            return Err(crate::Error::Unsupported {
                what: format!("a train step of {n} parameters takes at least {} tensors, got {}", 3 * n + 1, t.len()),
                loc: crate::SourceLoc::internal(),
            });
        }
        let (weights, rest) = t.split_at(n);
        let (m, rest) = rest.split_at(n);
        let (v, rest) = rest.split_at(n);
        let (scalars, batch) = (&rest[0], &rest[1..]);
        let args: Vec<Tensor> = weights.iter().chain(batch).cloned().collect();
        let wrt: Vec<usize> = (0..n).collect();
        // Gradients with respect to the weights themselves: through the rounding casts, in f32.
        let (value, grads) = crate::value_and_grad(|a| loss(&shape.load(&rounded(&a[..n])?)?, &a[n..]), &args, &wrt)?;
        let (w, m, v) = opt.update(weights, &grads, m, v, scalars)?;
        let params = if mixed { rounded(&w)? } else { Vec::new() };
        Ok([vec![value], w, m, v, params].concat())
    }
}

/// A model, its AdamW state (and f32 master weights for a half-precision model), and its compiled step.
pub struct Trainer<M, F> {
    model: M,
    masters: Option<Vec<Tensor>>,
    opt: AdamW,
    state: AdamWState,
    step: Compiled<F>,
}

impl<M: Module + Clone> Trainer<M, ()> {
    /// A trainer of `model` (its parameters where they are: move the model to a device first) by `opt`
    /// against `loss(model, batch)`, compiled for `backend`.
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
        let (_, mixed) = precision(&model);
        let masters = if mixed {
            Some(model.tensors().iter().map(|p| p.cast(DType::F32)).collect::<Result<Vec<_>>>()?)
        } else {
            None
        };
        let state = AdamWState::new(masters.as_deref().unwrap_or(&model.tensors()))?;
        let step = compile(adamw_step(&model, opt, loss)).backend(backend);
        Ok(Trainer { model, masters, opt, state, step })
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
        let args: Vec<Tensor> =
            [weights, self.state.m.clone(), self.state.v.clone(), vec![scalars], batch.to_vec()].concat();
        let out: Vec<Tensor> = self.step.call(args)?;
        let (loss, rest) = out.split_first().expect("a step returns its loss first");
        let (w, rest) = rest.split_at(n);
        let (m, rest) = rest.split_at(n);
        let (v, params) = rest.split_at(n);
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

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.state.step
    }

    /// What the compiled step did (traces, cache hits, recompiles).
    pub fn stats(&self) -> crate::CompileStats {
        self.step.stats()
    }
}
