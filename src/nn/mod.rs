//! Neural-network building blocks over [`Tensor`]: modules that hold their parameters as tensors, the
//! losses, and deterministic initialisation. A module is plain data (tensor handles), so a train step
//! rebuilds it from the parameter list it is given ([`Module::with_parameters`], like
//! `torch.func.functional_call`) and [`crate::value_and_grad`] can differentiate with respect to them.

mod checkpoint;
mod gpt;
mod init;

// The training loop's checkpoints (native only) write optimizer state with the same dtype names.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) use checkpoint::{from_safetensors as kiln_dtype, to_safetensors as safetensors_dtype};
pub use checkpoint::{load, save};
pub use gpt::{Gpt, GptConfig};
pub use init::Init;

use crate::{DType, Error, Result, SourceLoc, Tensor};

/// Something with named parameters that can be rebuilt around other tensors of the same shapes.
pub trait Module: Sized {
    /// Every parameter with its dotted name (`blocks.0.attn.qkv.weight`), in a fixed order.
    fn parameters(&self) -> Vec<(String, Tensor)>;

    /// This module with its parameters replaced, in [`Module::parameters`]' order, by what `next` yields.
    fn with_parameters(&self, next: &mut dyn Iterator<Item = Tensor>) -> Result<Self>;

    /// The parameter tensors alone, in order.
    fn tensors(&self) -> Vec<Tensor> {
        self.parameters().into_iter().map(|(_, t)| t).collect()
    }

    /// This module rebuilt around `params` (exactly as many as it has).
    fn load(&self, params: &[Tensor]) -> Result<Self> {
        let mut it = params.iter().cloned();
        let m = self.with_parameters(&mut it)?;
        match it.next() {
            None => Ok(m),
            Some(_) => Err(mismatch(format!("{} parameters given, the module has fewer", params.len()))),
        }
    }

    /// Every floating-point parameter cast to `dtype` (a bf16 model for mixed-precision training).
    fn cast(&self, dtype: DType) -> Result<Self> {
        let cast = self
            .tensors()
            .iter()
            .map(|t| if t.dtype().is_float() && t.dtype() != dtype { t.cast(dtype) } else { Ok(t.clone()) })
            .collect::<Result<Vec<_>>>()?;
        self.load(&cast)
    }

    /// Every parameter moved to `backend` (a device runtime), where a train step will use them.
    fn to(&self, backend: &std::sync::Arc<crate::Runtime>) -> Result<Self> {
        let moved = self.tensors().iter().map(|t| t.to(backend.clone())).collect::<Result<Vec<_>>>()?;
        self.load(&moved)
    }
}

/// A module's parameters do not fit: the error names what is wrong (no user line applies).
fn mismatch(what: String) -> Error {
    Error::Unsupported { what: format!("module parameters: {what}"), loc: SourceLoc::internal() }
}

/// The next parameter for a module being rebuilt.
fn take(next: &mut dyn Iterator<Item = Tensor>, name: &str) -> Result<Tensor> {
    next.next().ok_or_else(|| mismatch(format!("ran out before `{name}`")))
}

/// `y = x · weightᵀ + bias`, `weight` of shape `[out, in]` (torch's `nn.Linear`).
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Tensor,
    /// `[out]`, if any.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A layer of `inputs → outputs` initialised by `init`; biases start at zero.
    pub fn new(inputs: usize, outputs: usize, bias: bool, init: &mut Init) -> Result<Linear> {
        let weight = init.normal(&[outputs, inputs])?;
        let bias = if bias { Some(Tensor::zeros(&[outputs], DType::F32)?) } else { None };
        Ok(Linear { weight, bias })
    }

    /// Applies the layer over the last axis.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.linear(&self.weight, self.bias.as_ref())
    }
}

impl Module for Linear {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        v.extend(self.bias.iter().map(|b| ("bias".to_string(), b.clone())));
        v
    }

    fn with_parameters(&self, next: &mut dyn Iterator<Item = Tensor>) -> Result<Self> {
        let weight = take(next, "weight")?;
        let bias = match self.bias {
            Some(_) => Some(take(next, "bias")?),
            None => None,
        };
        Ok(Linear { weight, bias })
    }
}

/// A lookup table of `[count, dim]` rows indexed by integer ids (torch's `nn.Embedding`).
#[derive(Clone, Debug)]
pub struct Embedding {
    /// `[count, dim]`.
    pub weight: Tensor,
}

impl Embedding {
    /// `count` rows of `dim`, initialised by `init`.
    pub fn new(count: usize, dim: usize, init: &mut Init) -> Result<Embedding> {
        Ok(Embedding { weight: init.normal(&[count, dim])? })
    }

    /// The rows of `ids` (an integer tensor of any shape, at most one of its dims symbolic, such as a
    /// batch of varying size): shape `ids.shape + [dim]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let rows = self.weight.index_select(0, &ids.reshape(&[-1])?)?;
        let width = self.weight.shape().view_dims().get(1).copied().unwrap_or(-1);
        let mut out = ids.shape().view_dims();
        out.push(width);
        rows.reshape(&out)
    }
}

impl Module for Embedding {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }

    fn with_parameters(&self, next: &mut dyn Iterator<Item = Tensor>) -> Result<Self> {
        Ok(Embedding { weight: take(next, "weight")? })
    }
}

/// Layer normalisation over the last axis with a learned scale and shift (torch's `nn.LayerNorm`).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// Scale, `[dim]`, starts at one.
    pub weight: Tensor,
    /// Shift, `[dim]`, starts at zero.
    pub bias: Tensor,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// Over a last axis of `dim`, eps 1e-5.
    pub fn new(dim: usize) -> Result<LayerNorm> {
        Ok(LayerNorm { weight: Tensor::ones(&[dim], DType::F32)?, bias: Tensor::zeros(&[dim], DType::F32)?, eps: 1e-5 })
    }

    /// Normalises `x` over its last axis.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(1, Some(&self.weight), Some(&self.bias), self.eps)
    }
}

impl Module for LayerNorm {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone()), ("bias".to_string(), self.bias.clone())]
    }

    fn with_parameters(&self, next: &mut dyn Iterator<Item = Tensor>) -> Result<Self> {
        Ok(LayerNorm { weight: take(next, "weight")?, bias: take(next, "bias")?, eps: self.eps })
    }
}

/// Randomly zeroes elements while training (torch's `nn.Dropout`): each element is kept with probability
/// `1 - p` and scaled by `1/(1-p)`, the mask drawn from the step's key ([`Tensor::rng_key`]) by a
/// counter-based generator, so it is the same on every backend and the backward pass recomputes it. In
/// evaluation it is the identity. No parameters.
#[derive(Clone, Copy, Debug)]
pub struct Dropout {
    /// Probability of zeroing an element, in [0, 1).
    pub p: f64,
    /// Training (drop) or evaluation (identity).
    pub training: bool,
}

impl Dropout {
    /// Dropout with probability `p`, in training mode.
    pub fn new(p: f64) -> Dropout {
        Dropout { p, training: true }
    }

    /// `x` with dropout under `key` when training and `p > 0`; `x` itself otherwise.
    #[track_caller]
    pub fn forward(&self, x: &Tensor, key: &Tensor) -> Result<Tensor> {
        if self.training && self.p > 0.0 {
            x.dropout(self.p, key)
        } else {
            Ok(x.clone())
        }
    }
}

/// Mean cross-entropy of `logits` `[n, classes]` against integer `targets` `[n]` (torch's
/// `F.cross_entropy`): a log-softmax and the negative log-likelihood of each row's target, fused by
/// the compiler. Half-precision logits are read as f32 and the loss is f32 (torch's autocast runs it
/// in f32 too): a log-sum-exp over a vocabulary in f16 loses the digits that separate the targets, and
/// a scaled loss's gradient (2¹⁶ at first) does not fit f16 until the mean has divided it.
/// The batch dim may be symbolic (a shorter last batch compiles once for every size).
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    if logits.rank() != 2 || targets.rank() != 1 {
        return Err(mismatch(format!(
            "cross_entropy takes logits [n, classes] and targets [n], got {} and {}",
            logits.shape(),
            targets.shape()
        )));
    }
    let logits = &match logits.dtype() {
        DType::F16 | DType::BF16 => logits.cast(DType::F32)?,
        _ => logits.clone(),
    };
    let picked = logits.log_softmax(-1)?.gather(1, &targets.unsqueeze(1)?)?;
    picked.mean(&[0, 1], false)?.neg()
}

/// Mean squared error between `a` and `b` over every element.
pub fn mse_loss(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let d = a.sub(b)?;
    let axes: Vec<isize> = (0..d.rank() as isize).collect();
    d.mul(&d)?.mean(&axes, false)
}

/// Prefixes each name with `prefix.`.
fn scoped(prefix: &str, params: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    params.into_iter().map(|(n, t)| (format!("{prefix}.{n}"), t)).collect()
}
