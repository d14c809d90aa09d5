//! A compiled AdamW training loop in a few lines: [`Trainer`] holds a model's parameters and the
//! optimizer's moments on the device, and [`Trainer::step`] runs one compiled step — forward, loss,
//! backward ([`crate::value_and_grad`]) and the AdamW update — traced and fused as one graph, so a step
//! is one call with no host round trip (the loss stays on the device until read).
//!
//! Mixed precision: a model whose parameters are bf16 or f16 trains on f32 master weights (updates far
//! below a half's resolution accumulate there); the step computes the forward and backward in the
//! model's dtypes on its parameters — the masters rounded down at the previous step's end, handed in
//! as they are rather than rounded again — and hands back both the new masters and their rounding.
//! An f16 model's step also scales its loss dynamically ([`crate::loss_scale`]): its gradients would
//! otherwise flush to zero below f16's range; a step that overflows is skipped on the device.
//!
//! Gradient accumulation ([`StepOptions::accumulate`]) splits the step in two compiled functions: one
//! adds a micro-batch's weighted gradients to a running sum (its activations are freed before the next
//! micro-batch runs), the other clips and applies the sum. Without accumulation the step stays one graph.
//!
//! Data parallel ([`Trainer::data_parallel`]): without accumulation the one-graph step averages its
//! gradients across the world itself ([`Tensor::all_reduce`] on each): the compiler buckets the
//! all-reduces by when the backward pass makes their gradients and runs each bucket beside the rest
//! of the backward (`kiln_graph::bucket`), so the step is still one call. With accumulation the
//! summed gradients are averaged between the two halves.

#[cfg(not(target_arch = "wasm32"))]
use crate::dist::{ProcessGroup, Reduce};
use crate::loss_scale::{self, LossScale, LossScaleState};
use crate::nn::Module;
use crate::optim::{AdamW, AdamWState};
use crate::{compile, Compiled, DType, Result, Tensor};
use std::sync::Arc;

/// A data-parallel world (browsers have none).
#[cfg(not(target_arch = "wasm32"))]
type Group = Arc<ProcessGroup>;
#[cfg(target_arch = "wasm32")]
type Group = std::convert::Infallible;

/// How a data-parallel trainer averages its gradients across the world ([`Trainer::data_parallel_with`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataParallel {
    /// A half-precision model's gradients are averaged in its own dtype (bf16, f16) and widened after,
    /// instead of averaged in f32 as gradients of the f32 master weights (torch's DDP under autocast):
    /// half the bytes each step sends, each average rounded once to the narrow dtype (torch's
    /// `bf16_compress_hook`, FSDP's `reduce_dtype`). No effect on an f32 model, with loss scaling, or
    /// with gradient accumulation (whose sums are averaged in f32 between its two halves).
    pub reduce_in_model_dtype: bool,
}

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

/// What a [`Trainer`]'s step does besides the optimizer's update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOptions {
    /// Dynamic loss scaling (the default for f16 models, see [`LossScale`]); `None`: the loss unscaled.
    pub loss_scale: Option<LossScale>,
    /// Scale the gradients down to this global L2 norm before the update (torch's `clip_grad_norm_`).
    pub clip_grad_norm: Option<f64>,
    /// Micro-batches whose gradients are summed into each update (1: none); see [`Trainer::step_group`].
    pub accumulate: usize,
    /// Compile the steps with the batch dim symbolic from the first call (batches of several sizes).
    pub dynamic_batch: Option<DynamicBatch>,
    /// How the compiled steps run (the one-graph step, or both halves of an accumulated one):
    /// [`crate::Mode::ReduceOverhead`] replays each as a CUDA graph (its collectives too), with no
    /// per-kernel launch cost on the host.
    pub mode: crate::Mode,
}

impl Default for StepOptions {
    fn default() -> Self {
        StepOptions {
            loss_scale: None,
            clip_grad_norm: None,
            accumulate: 1,
            dynamic_batch: None,
            mode: crate::Mode::Default,
        }
    }
}

/// A batch whose first dim varies (a shorter last batch): the steps are compiled once with that dim
/// symbolic, so every batch runs the same kernels — a run resumed mid-epoch then computes bit for bit
/// what the uninterrupted run did, which a static entry for the first size and a symbolic one for the
/// rest would not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DynamicBatch {
    /// The batch's leading tensors that have the batch as their first dim (the rest, such as a dropout
    /// key, are static).
    pub columns: usize,
    /// The largest batch.
    pub max: usize,
}

impl DynamicBatch {
    /// `compiled` with dim 0 of `columns` tensors from argument `first` on symbolic in `1..=max`.
    pub fn mark<F>(self, compiled: Compiled<F>, first: usize) -> Compiled<F> {
        (first..first + self.columns).fold(compiled, |c, arg| c.mark_dynamic(arg, 0, 1..=self.max.max(1)))
    }
}

/// `grads` clipped to `max_norm` when one is given.
fn clipped(grads: Vec<Tensor>, max_norm: Option<f64>) -> Result<Vec<Tensor>> {
    match max_norm {
        Some(c) => Ok(crate::optim::clip_grad_norm(&grads, c)?.0),
        None => Ok(grads),
    }
}

/// Rounds f32 master weights to the model's own dtypes.
fn rounder(dtypes: Vec<DType>) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>> {
    move |w: &[Tensor]| {
        w.iter().zip(&dtypes).map(|(w, &d)| if w.dtype() == d { Ok(w.clone()) } else { w.cast(d) }).collect()
    }
}

fn too_few(what: &str, want: usize, got: usize) -> crate::Error {
    crate::Error::Unsupported {
        what: format!("{what} takes at least {want} tensors, got {got}"),
        loc: crate::SourceLoc::internal(),
    }
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
    adamw_step_with(model, opt, StepOptions { loss_scale: scaling, ..StepOptions::default() }, loss)
}

/// [`adamw_step_scaled`] with gradient clipping as `options` say (`options.accumulate` is the
/// [`Trainer`]'s business: this is one whole step).
pub fn adamw_step_with<M: Module + Clone>(
    model: &M,
    opt: AdamW,
    options: StepOptions,
    loss: impl Fn(&M, &[Tensor]) -> Result<Tensor>,
) -> impl StepFn {
    adamw_step_averaged(model, opt, options, Arc::default(), false, loss)
}

/// [`adamw_step_with`], whose gradients and loss are averaged across the data-parallel world
/// ([`Tensor::all_reduce`]) as `averaged` says at the time it is traced (unset: not at all): the
/// all-reduces are ops of the one compiled step, which buckets them and runs each bucket beside the
/// backward pass as soon as its gradients are made.
fn adamw_step_averaged<M: Module + Clone>(
    model: &M,
    opt: AdamW,
    options: StepOptions,
    averaged: Arc<std::sync::OnceLock<DataParallel>>,
    takes_params: bool,
    loss: impl Fn(&M, &[Tensor]) -> Result<Tensor>,
) -> impl StepFn {
    let (scaling, clip) = (options.loss_scale, options.clip_grad_norm);
    let n = model.tensors().len();
    let (dtypes, mixed) = precision(model);
    let shape = model.clone();
    let rounded = rounder(dtypes);
    let extra = usize::from(scaling.is_some());
    // The half-precision parameters themselves, after the scaler's state (the trainer's, which are
    // its masters rounded at the previous step's end): the forward reads them as they are, with no
    // rounding of the masters at the start of each step.
    let given = if takes_params && mixed { n } else { 0 };
    move |t: Vec<Tensor>| {
        let least = 3 * n + 1 + extra + given;
        if t.len() < least {
            return Err(too_few(&format!("a train step of {n} parameters"), least, t.len()));
        }
        let (weights, rest) = t.split_at(n);
        let (m, rest) = rest.split_at(n);
        let (v, rest) = rest.split_at(n);
        let (scalars, rest) = (&rest[0], &rest[1..]);
        let (state, rest) = rest.split_at(extra);
        let (params, batch) = rest.split_at(given);
        let params = if given > 0 { params.to_vec() } else { rounded(weights)? };
        let wrt: Vec<usize> = (0..n).collect();
        // With loss scaling, the scale is an argument after the parameters (data, not a constant).
        let scale = state.first().map(loss_scale::scale_of).transpose()?;
        let args: Vec<Tensor> = params.iter().chain(&scale).chain(batch).cloned().collect();
        // Gradients with respect to the parameters in the model's dtypes; widened to f32 they are the
        // gradients with respect to the f32 masters (a rounding's gradient is the widening).
        let (value, grads) = crate::value_and_grad(
            |a| {
                let l = loss(&shape.load(&a[..n])?, &a[n + extra..])?;
                if extra == 0 {
                    return Ok(l);
                }
                l.cast(DType::F32)?.mul(&a[n])
            },
            &args,
            &wrt,
        )?;
        let mean = |t: &Tensor| t.all_reduce(crate::graph::ir::CollectiveOp::Mean);
        let wide = |g: &Tensor| g.cast(DType::F32);
        let grads = match averaged.get() {
            // Averaged in the model's dtype, then widened (only without scaling: see `DataParallel`).
            Some(dp) if dp.reduce_in_model_dtype && extra == 0 => {
                grads.iter().map(|g| wide(&mean(g)?)).collect::<Result<Vec<_>>>()?
            }
            _ => grads.iter().map(wide).collect::<Result<Vec<_>>>()?,
        };
        let (Some(cfg), Some(state), Some(scale)) = (scaling, state.first(), scale) else {
            let (value, grads) = match averaged.get() {
                Some(dp) if dp.reduce_in_model_dtype => (mean(&value)?, grads),
                Some(_) => (mean(&value)?, grads.iter().map(mean).collect::<Result<Vec<_>>>()?),
                None => (value, grads),
            };
            let (w, m, v) = opt.update(weights, &clipped(grads, clip)?, m, v, scalars)?;
            let params = if mixed { rounded(&w)? } else { Vec::new() };
            return Ok([vec![value], w, m, v, params].concat());
        };
        let inverse = scale.reciprocal()?;
        let grads = grads.iter().map(|g| g.mul(&inverse)).collect::<Result<Vec<_>>>()?;
        let overflow = loss_scale::found_overflow(&grads)?;
        let grads = clipped(grads, clip)?;
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

/// The first half of an accumulated step: over `[weights…, sums…, weight, batch…]` returns
/// `[loss, sums + weight · ∂loss/∂weights…]` (the loss itself unweighted; gradients in f32, with respect
/// to the weights, which are a half-precision model's f32 masters).
fn accumulate_step<M: Module + Clone>(model: &M, loss: impl Fn(&M, &[Tensor]) -> Result<Tensor>) -> impl StepFn {
    let n = model.tensors().len();
    let (dtypes, _) = precision(model);
    let (shape, rounded) = (model.clone(), rounder(dtypes));
    move |t: Vec<Tensor>| {
        if t.len() < 2 * n + 1 {
            return Err(too_few(&format!("an accumulation step of {n} parameters"), 2 * n + 1, t.len()));
        }
        let (weights, rest) = t.split_at(n);
        let (sums, rest) = rest.split_at(n);
        let (weight, batch) = (&rest[0], &rest[1..]);
        let args: Vec<Tensor> = weights.iter().chain(batch).cloned().collect();
        let wrt: Vec<usize> = (0..n).collect();
        let (value, grads) = crate::value_and_grad(|a| loss(&shape.load(&rounded(&a[..n])?)?, &a[n..]), &args, &wrt)?;
        let sums = sums
            .iter()
            .zip(&grads)
            .map(|(s, g)| s.add(&g.cast(DType::F32)?.mul(weight)?))
            .collect::<Result<Vec<_>>>()?;
        Ok([vec![value], sums].concat())
    }
}

/// The second half: over `[weights…, m…, v…, scalars, grads…]` returns `[weights…, m…, v…, params…]`
/// after clipping `grads` (when asked) and one AdamW update; `params` are a half-precision model's
/// parameters rounded from the new masters (none for an f32 model).
fn apply_step(dtypes: Vec<DType>, opt: AdamW, clip: Option<f64>) -> impl StepFn {
    let n = dtypes.len();
    let mixed = dtypes.iter().any(|d| matches!(d, DType::BF16 | DType::F16));
    let rounded = rounder(dtypes);
    move |t: Vec<Tensor>| {
        if t.len() != 4 * n + 1 {
            return Err(crate::Error::Unsupported {
                what: format!("an update of {n} parameters takes {} tensors, got {}", 4 * n + 1, t.len()),
                loc: crate::SourceLoc::internal(),
            });
        }
        let (weights, rest) = t.split_at(n);
        let (m, rest) = rest.split_at(n);
        let (v, rest) = rest.split_at(n);
        let (scalars, grads) = (&rest[0], &rest[1..]);
        let (w, m, v) = opt.update(weights, &clipped(grads.to_vec(), clip)?, m, v, scalars)?;
        let params = if mixed { rounded(&w)? } else { Vec::new() };
        Ok([w, m, v, params].concat())
    }
}

/// A compiled function over a tensor list, its closure type erased (the accumulation halves).
type BoxedStep = Box<dyn Fn(Vec<Tensor>) -> Result<Vec<Tensor>>>;

/// Gradient accumulation's two compiled halves and the zeros each update's sums start from.
struct Accumulation {
    add: Compiled<BoxedStep>,
    apply: Compiled<BoxedStep>,
    zeros: Vec<Tensor>,
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
    options: StepOptions,
    accumulation: Accumulation,
    /// The data-parallel world whose ranks average their gradients each step (browsers have none).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    group: Option<Group>,
    /// Micro-batch weights already on the device, by their f32 bits.
    micro_weights: Vec<(u32, Tensor)>,
    /// How the one-graph step averages its gradients across the world (read when it is traced; set
    /// by [`Trainer::data_parallel_with`], which browsers have not; unset: it does not).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    averaged: Arc<std::sync::OnceLock<DataParallel>>,
}

impl<M: Module + Clone + 'static> Trainer<M, ()> {
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
        L: Fn(&M, &[Tensor]) -> Result<Tensor> + 'static,
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
        L: Fn(&M, &[Tensor]) -> Result<Tensor> + 'static,
    {
        Trainer::with_options(model, opt, StepOptions { loss_scale: scaling, ..StepOptions::default() }, loss, backend)
    }

    /// [`Trainer::new`] with every step option given. Accumulation with loss scaling is refused (an f16
    /// model's skipped steps would need the sums discarded on the device).
    pub fn with_options<L>(
        model: M,
        opt: AdamW,
        options: StepOptions,
        loss: L,
        backend: impl crate::graph::IntoBackend,
    ) -> Result<Trainer<M, impl StepFn>>
    where
        L: Fn(&M, &[Tensor]) -> Result<Tensor> + 'static,
    {
        if options.accumulate > 1 && options.loss_scale.is_some() {
            return Err(crate::Error::Unsupported {
                what: "gradient accumulation with loss scaling (train an f16 model without accumulation, or in bf16)"
                    .into(),
                loc: crate::SourceLoc::internal(),
            });
        }
        let (dtypes, mixed) = precision(&model);
        let dtypes_len = dtypes.len();
        let masters = if mixed {
            Some(model.tensors().iter().map(|p| p.cast(DType::F32)).collect::<Result<Vec<_>>>()?)
        } else {
            None
        };
        let weights = masters.clone().unwrap_or_else(|| model.tensors());
        let state = AdamWState::new(&weights)?;
        let scaler = match (options.loss_scale, weights.first()) {
            (Some(cfg), Some(like)) => Some(cfg.initial_state(like)?),
            _ => None,
        };
        let loss = std::sync::Arc::new(loss);
        let backend = backend.into_backend()?;
        // Built whatever the options (compiling is lazy: nothing is traced until used), since a trainer
        // made data-parallel later splits its steps too.
        let accumulation = {
            let l = loss.clone();
            let add: BoxedStep = Box::new(accumulate_step(&model, move |m: &M, b: &[Tensor]| l(m, b)));
            let apply: BoxedStep = Box::new(apply_step(dtypes, opt, options.clip_grad_norm));
            // Fresh moments are zeros of the weights' (f32) shapes: the sums start from them.
            let zeros = state.m.clone();
            let mut add = compile(add).backend(backend.clone()).mode(options.mode);
            if let Some(d) = options.dynamic_batch {
                add = d.mark(add, 2 * dtypes_len + 1);
            }
            Accumulation { add, apply: compile(apply).backend(backend.clone()).mode(options.mode), zeros }
        };
        let (l, averaged) = (loss.clone(), Arc::new(std::sync::OnceLock::new()));
        let step_fn =
            adamw_step_averaged(&model, opt, options, averaged.clone(), true, move |m: &M, b: &[Tensor]| l(m, b));
        let mut step = compile(step_fn).backend(backend).mode(options.mode);
        if let Some(d) = options.dynamic_batch {
            let params = if masters.is_some() { dtypes_len } else { 0 };
            step = d.mark(step, 3 * dtypes_len + 1 + usize::from(scaler.is_some()) + params);
        }
        Ok(Trainer {
            model,
            masters,
            opt,
            state,
            scaler,
            step,
            options,
            accumulation,
            group: None,
            micro_weights: Vec::new(),
            averaged,
        })
    }
}

impl<M: Module, F: StepFn> Trainer<M, F> {
    /// One step on `batch` with the learning rate scaled by `lr_scale` (a schedule's factor, 1.0 for
    /// none); returns the loss before the update, still on the device.
    pub fn step(&mut self, batch: &[Tensor], lr_scale: f64) -> Result<Tensor> {
        if self.splits() {
            return Ok(self.step_group(&[batch.to_vec()], &[1.0], lr_scale)?.remove(0));
        }
        let weights = self.masters.clone().unwrap_or_else(|| self.model.tensors());
        let n = weights.len();
        let anchor = weights.first().cloned().ok_or_else(|| crate::Error::Unsupported {
            what: "a model without parameters".into(),
            loc: crate::SourceLoc::internal(),
        })?;
        let scalars = self.state.scalars(&self.opt, lr_scale, &anchor)?;
        let scaler: Vec<Tensor> = self.scaler.iter().cloned().collect();
        // A half-precision model's own parameters too (`adamw_step_averaged`'s `takes_params`).
        let params = if self.masters.is_some() { self.model.tensors() } else { Vec::new() };
        let (m, v) = (self.state.m.clone(), self.state.v.clone());
        let args: Vec<Tensor> = [weights, m, v, vec![scalars], scaler, params, batch.to_vec()].concat();
        let out: Vec<Tensor> = self.step.call(args)?;
        let (loss, rest) = out.split_first().expect("a step returns its loss first");
        let (w, rest) = rest.split_at(n);
        let (m, rest) = rest.split_at(n);
        let (v, rest) = rest.split_at(n);
        let (scaler, params) = rest.split_at(usize::from(self.scaler.is_some()));
        if let Some(s) = scaler.first() {
            self.scaler = Some(s.clone());
        }
        self.keep(w, m, v, params)?;
        Ok(loss.clone())
    }

    /// One optimizer step over several micro-batches (gradient accumulation): each micro-batch's
    /// gradients, weighted by `weights` (usually its share of the samples, summing to one), are added
    /// up one micro-batch at a time, then clipped and applied once. Returns each micro-batch's loss,
    /// unweighted, on the device. Without [`StepOptions::accumulate`] > 1 a single micro-batch takes the
    /// one-graph [`Trainer::step`]. A data-parallel trainer ([`Trainer::data_parallel`]) averages the
    /// summed gradients and the losses over the ranks (one NCCL group, queued on the device between
    /// the two halves) before the update: the ranks' `weights` each sum to one over equal shares.
    pub fn step_group(&mut self, batches: &[Vec<Tensor>], weights: &[f64], lr_scale: f64) -> Result<Vec<Tensor>> {
        if batches.len() != weights.len() || batches.is_empty() {
            return Err(crate::Error::Unsupported {
                what: format!("{} micro-batches with {} weights", batches.len(), weights.len()),
                loc: crate::SourceLoc::internal(),
            });
        }
        if !self.splits() {
            if batches.len() == 1 {
                return Ok(vec![self.step(&batches[0], lr_scale)?]);
            }
            return Err(crate::Error::Unsupported {
                what: format!("{} micro-batches for a trainer built without accumulation", batches.len()),
                loc: crate::SourceLoc::internal(),
            });
        }
        let weights_now = self.masters.clone().unwrap_or_else(|| self.model.tensors());
        let n = weights_now.len();
        let anchor = weights_now[0].clone();
        // Every upload waits for the device (a pageable copy), so this step's are made before any of its
        // work is queued: the wait is then for the previous step's tail only, as in the one-graph step.
        let scalars = self.state.scalars(&self.opt, lr_scale, &anchor)?;
        let micro_weights = weights.iter().map(|&w| self.micro_weight(w, &anchor)).collect::<Result<Vec<Tensor>>>()?;
        let acc = &self.accumulation;
        let mut sums = acc.zeros.clone();
        let mut losses = Vec::with_capacity(batches.len());
        for (batch, weight) in batches.iter().zip(micro_weights) {
            let args = [weights_now.clone(), sums, vec![weight], batch.clone()].concat();
            let mut out: Vec<Tensor> = acc.add.call(args)?;
            sums = out.split_off(1);
            losses.push(out.remove(0));
        }
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(g) = &self.group {
            let k = losses.len();
            let mut reduced = g.all_reduce(&[losses, sums].concat(), Reduce::Mean)?;
            sums = reduced.split_off(k);
            losses = reduced;
        }
        let args = [weights_now, self.state.m.clone(), self.state.v.clone(), vec![scalars], sums].concat();
        let out: Vec<Tensor> = acc.apply.call(args)?;
        let (w, rest) = out.split_at(n);
        let (m, rest) = rest.split_at(n);
        let (v, params) = rest.split_at(n);
        self.keep(w, m, v, params)?;
        Ok(losses)
    }

    /// A micro-batch's weight as a device scalar, uploaded once per distinct value (an upload waits for
    /// the device; the weights repeat from step to step).
    fn micro_weight(&mut self, w: f64, anchor: &Tensor) -> Result<Tensor> {
        let key = (w as f32).to_bits();
        if let Some(t) = self.micro_weights.iter().find(|(k, _)| *k == key) {
            return Ok(t.1.clone());
        }
        let t = Tensor::scalar(w, DType::F32)?;
        let t = match anchor.value().and_then(|v| v.device()) {
            Some(d) => t.to(d.buffer.runtime().clone())?,
            None => t,
        };
        // A handful of values in practice (full batches, a shorter last one); bounded all the same.
        if self.micro_weights.len() >= 64 {
            self.micro_weights.clear();
        }
        self.micro_weights.push((key, t.clone()));
        Ok(t)
    }

    /// Keeps an update's results: the weights (a half-precision model's masters, its `params` rounded
    /// from them) and the moments.
    fn keep(&mut self, w: &[Tensor], m: &[Tensor], v: &[Tensor], params: &[Tensor]) -> Result<()> {
        match &mut self.masters {
            Some(masters) => {
                *masters = w.to_vec();
                self.model = self.model.load(params)?;
            }
            None => self.model = self.model.load(w)?,
        }
        self.state.m = m.to_vec();
        self.state.v = v.to_vec();
        Ok(())
    }

    /// The options the steps were built with.
    pub fn options(&self) -> StepOptions {
        self.options
    }

    /// The optimizer's state (moments and steps taken), on the device.
    pub fn optimizer_state(&self) -> &AdamWState {
        &self.state
    }

    /// Puts back a state saved earlier (a checkpoint): the model's parameters, the f32 masters of a
    /// half-precision model and the optimizer's state. Shapes and dtypes must be those the steps were
    /// compiled for (anything else recompiles or fails at the next step).
    pub fn restore(&mut self, model: M, masters: Option<Vec<Tensor>>, state: AdamWState) -> Result<()> {
        if masters.is_some() != self.masters.is_some() {
            return Err(crate::Error::Unsupported {
                what: "restoring a trainer: master weights given for a model that has none, or missing".into(),
                loc: crate::SourceLoc::internal(),
            });
        }
        self.model = model;
        self.masters = masters;
        self.state = state;
        Ok(())
    }

    /// What the accumulation halves did (`None` when the steps are not split: no accumulation, not
    /// data-parallel): the adding half's counters and the applying half's.
    pub fn accumulation_stats(&self) -> Option<(crate::CompileStats, crate::CompileStats)> {
        self.splits().then(|| (self.accumulation.add.stats(), self.accumulation.apply.stats()))
    }

    /// Whether a step runs as two halves (accumulation; a data-parallel world averages the sums
    /// between them). A data-parallel step without accumulation stays one graph, its all-reduces ops of it.
    fn splits(&self) -> bool {
        self.options.accumulate > 1
    }

    /// Makes this trainer one rank of data-parallel training over `group`: every rank's parameters
    /// (and master weights) become rank 0's, and each step averages the ranks' gradients before the
    /// update, so the ranks stay identical. Each rank must step on its own equal share of every batch
    /// ([`crate::data::Loader::shard`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn data_parallel(self, group: Arc<ProcessGroup>) -> Result<Self> {
        self.data_parallel_with(group, DataParallel::default())
    }

    /// [`Trainer::data_parallel`], averaging as `how` says.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn data_parallel_with(mut self, group: Arc<ProcessGroup>, how: DataParallel) -> Result<Self> {
        if self.scaler.is_some() {
            return Err(crate::Error::Unsupported {
                what: "data-parallel training with loss scaling (train an f16 model in bf16 instead)".into(),
                loc: crate::SourceLoc::internal(),
            });
        }
        // The step averages its gradients from its first trace on: one traced alone would be reused.
        if self.step.stats().traces > 0 {
            return Err(crate::Error::Unsupported {
                what: "making a trainer data-parallel after its first step (make it data-parallel first)".into(),
                loc: crate::SourceLoc::internal(),
            });
        }
        let params = group.broadcast(&self.model.tensors(), 0)?;
        self.model = self.model.load(&params)?;
        if let Some(m) = &self.masters {
            self.masters = Some(group.broadcast(m, 0)?);
        }
        self.group = Some(group);
        // A fresh trainer's (checked above: never traced), so never set before.
        let _ = self.averaged.set(how);
        Ok(self)
    }

    /// The data-parallel world this trainer is a rank of.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn group(&self) -> Option<&Arc<ProcessGroup>> {
        self.group.as_ref()
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

    /// The compile report of each function a step runs, by name: `train_step` (the one compiled step),
    /// or `accumulate` and `apply` when steps are split (accumulation).
    pub fn reports(&self) -> Vec<(&'static str, crate::CompileReport)> {
        if self.splits() {
            vec![("accumulate", self.accumulation.add.report()), ("apply", self.accumulation.apply.report())]
        } else {
            vec![("train_step", self.step.report())]
        }
    }
}
