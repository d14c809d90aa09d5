//! A compiled AdamW training loop in a few lines: [`Trainer`] holds a model's parameters and the
//! optimizer's moments on the device, and [`Trainer::step`] runs one compiled step — forward, loss,
//! backward ([`crate::value_and_grad`]) and the AdamW update — traced and fused as one graph, so a step
//! is one call with no host round trip (the loss stays on the device until read).

use crate::nn::Module;
use crate::optim::{AdamW, AdamWState};
use crate::{compile, Compiled, Result, Tensor};

/// A compiled-step function: the whole argument list in, the whole result list out.
pub trait StepFn: Fn(Vec<Tensor>) -> Result<Vec<Tensor>> {}

impl<F: Fn(Vec<Tensor>) -> Result<Vec<Tensor>>> StepFn for F {}

/// The step function a [`Trainer`] compiles: over `[params…, m…, v…, scalars, batch…]`, returns
/// `[loss, params…, m…, v…]` after one AdamW update of `model`'s parameters against `loss(model, batch)`.
pub fn adamw_step<M: Module + Clone>(
    model: &M,
    opt: AdamW,
    loss: impl Fn(&M, &[Tensor]) -> Result<Tensor>,
) -> impl StepFn {
    let n = model.tensors().len();
    let shape = model.clone();
    move |t: Vec<Tensor>| {
        if t.len() < 3 * n + 1 {
            return Err(crate::Error::Unsupported {
                what: format!("a train step of {n} parameters takes at least {} tensors, got {}", 3 * n + 1, t.len()),
                loc: crate::SourceLoc::caller(),
            });
        }
        let (params, rest) = t.split_at(n);
        let (m, rest) = rest.split_at(n);
        let (v, rest) = rest.split_at(n);
        let (scalars, batch) = (&rest[0], &rest[1..]);
        let args: Vec<Tensor> = params.iter().chain(batch).cloned().collect();
        let wrt: Vec<usize> = (0..n).collect();
        let (value, grads) = crate::value_and_grad(|a| loss(&shape.load(&a[..n])?, &a[n..]), &args, &wrt)?;
        let (p, m, v) = opt.update(params, &grads, m, v, scalars)?;
        Ok([vec![value], p, m, v].concat())
    }
}

/// A model, its AdamW state, and its compiled train step.
pub struct Trainer<M, F> {
    model: M,
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
        let state = AdamWState::new(&model.tensors())?;
        let step = compile(adamw_step(&model, opt, loss)).backend(backend);
        Ok(Trainer { model, opt, state, step })
    }
}

impl<M: Module, F: StepFn> Trainer<M, F> {
    /// One step on `batch` with the learning rate scaled by `lr_scale` (a schedule's factor, 1.0 for
    /// none); returns the loss before the update, still on the device.
    pub fn step(&mut self, batch: &[Tensor], lr_scale: f64) -> Result<Tensor> {
        let params = self.model.tensors();
        let n = params.len();
        let anchor = params.first().cloned().ok_or_else(|| crate::Error::Unsupported {
            what: "a model without parameters".into(),
            loc: crate::SourceLoc::caller(),
        })?;
        let scalars = self.state.scalars(&self.opt, lr_scale, &anchor)?;
        let args: Vec<Tensor> =
            [params, self.state.m.clone(), self.state.v.clone(), vec![scalars], batch.to_vec()].concat();
        let out: Vec<Tensor> = self.step.call(args)?;
        self.model = self.model.load(&out[1..1 + n])?;
        self.state.m = out[1 + n..1 + 2 * n].to_vec();
        self.state.v = out[1 + 2 * n..1 + 3 * n].to_vec();
        Ok(out[0].clone())
    }

    /// The model as trained so far.
    pub fn model(&self) -> &M {
        &self.model
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
