//! A GPT (pre-LN transformer decoder): token and position embeddings, blocks of causal self-attention and
//! an MLP (the block W5 times, `graph::workloads::gpt_block`, so the model and the benchmark are one
//! definition), a final layer norm and a linear head over the vocabulary.

use super::{cross_entropy, scoped, take, Embedding, Init, LayerNorm, Linear, Module};
use crate::{DType, Result, Tensor};

/// A GPT's sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptConfig {
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// Longest sequence (positions embedded).
    pub context: usize,
    /// Model width.
    pub dim: usize,
    /// Attention heads (`dim` must be a multiple).
    pub heads: usize,
    /// Blocks.
    pub layers: usize,
    /// Dropout probability while training (GPT-2's sites: the embeddings, and in each block the
    /// attention weights, the attention's output and the MLP's output); 0 for none.
    pub dropout: f64,
}

/// One block's parameter names, in `gpt_block`'s order.
const BLOCK: [&str; 12] = [
    "ln1.weight",
    "ln1.bias",
    "attn.qkv.weight",
    "attn.qkv.bias",
    "attn.proj.weight",
    "attn.proj.bias",
    "ln2.weight",
    "ln2.bias",
    "mlp.fc.weight",
    "mlp.fc.bias",
    "mlp.proj.weight",
    "mlp.proj.bias",
];

/// The model: parameters only (a forward pass is a function of them).
#[derive(Clone, Debug)]
pub struct Gpt {
    /// Sizes.
    pub config: GptConfig,
    /// Token embedding `[vocab, dim]`.
    pub tokens: Embedding,
    /// Position embedding `[context, dim]`.
    pub positions: Embedding,
    /// Each block's 12 parameters, in [`BLOCK`]'s order.
    pub blocks: Vec<Vec<Tensor>>,
    /// The final layer norm.
    pub ln_f: LayerNorm,
    /// Logits from the last hidden state, no bias.
    pub head: Linear,
}

impl Gpt {
    /// A model of `config` initialised from `seed` (GPT-2's scheme: N(0, 0.02) weights, zero biases,
    /// unit layer-norm scales).
    pub fn new(config: GptConfig, seed: u64) -> Result<Gpt> {
        let mut init = Init::new(seed);
        let d = config.dim;
        let mut blocks = Vec::with_capacity(config.layers);
        for _ in 0..config.layers {
            let ln = LayerNorm::new(d)?;
            let qkv = Linear::new(d, 3 * d, true, &mut init)?;
            let proj = Linear::new(d, d, true, &mut init)?;
            let ln2 = LayerNorm::new(d)?;
            let fc = Linear::new(d, 4 * d, true, &mut init)?;
            let out = Linear::new(4 * d, d, true, &mut init)?;
            blocks.push(
                [ln.tensors(), qkv.tensors(), proj.tensors(), ln2.tensors(), fc.tensors(), out.tensors()].concat(),
            );
        }
        Ok(Gpt {
            config,
            tokens: Embedding::new(config.vocab, d, &mut init)?,
            positions: Embedding::new(config.context, d, &mut init)?,
            blocks,
            ln_f: LayerNorm::new(d)?,
            head: Linear::new(d, config.vocab, false, &mut init)?,
        })
    }

    /// Logits `[batch, seq, vocab]` for token ids `[batch, seq]` (i64, `seq` ≤ context), in evaluation
    /// (no dropout).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_with(ids, None)
    }

    /// [`Gpt::forward`] while training: dropout of the config's probability, its masks drawn under `key`
    /// (the step's [`Tensor::rng_key`]; a new key each step changes data, not the graph), one random
    /// stream per site.
    pub fn forward_train(&self, ids: &Tensor, key: &Tensor) -> Result<Tensor> {
        self.forward_with(ids, Some(key))
    }

    fn forward_with(&self, ids: &Tensor, key: Option<&Tensor>) -> Result<Tensor> {
        use kiln_graph::workloads::{gpt_block_train, BlockDropout};
        // The sequence's length is static (the batch may be symbolic).
        let seq = ids.shape().view_dims().get(1).copied().filter(|&s| s >= 0).ok_or_else(|| {
            kiln_graph::Error::Unsupported {
                what: format!("a GPT takes ids [batch, seq] with a static seq, got {}", ids.shape()),
                loc: kiln_graph::SourceLoc::internal(),
            }
        })? as usize;
        let x = self.tokens.forward(ids)?;
        let pos = self.positions.weight.narrow(0, 0, seq)?;
        let p = self.config.dropout;
        let mut x = match key {
            Some(key) if p > 0.0 => x.add(&pos)?.dropout_in(p, key, 0)?,
            _ => x.add(&pos)?,
        };
        for (i, w) in self.blocks.iter().enumerate() {
            let dropout = key.map(|key| BlockDropout { p, key, stream: 1 + 3 * i as u32 });
            x = gpt_block_train(&x, w, self.config.heads, dropout)?;
        }
        self.head.forward(&self.ln_f.forward(&x)?)
    }

    /// Mean next-token cross-entropy of `ids` against `targets` (both `[batch, seq]`, i64), in
    /// evaluation (no dropout).
    pub fn loss(&self, ids: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self.cross_entropy(&self.forward(ids)?, targets)
    }

    /// [`Gpt::loss`] while training, with dropout under `key` (see [`Gpt::forward_train`]).
    pub fn loss_train(&self, ids: &Tensor, targets: &Tensor, key: &Tensor) -> Result<Tensor> {
        self.cross_entropy(&self.forward_train(ids, key)?, targets)
    }

    fn cross_entropy(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let v = self.config.vocab as isize;
        cross_entropy(&logits.reshape(&[-1, v])?, &targets.reshape(&[-1])?.cast(DType::I64)?)
    }
}

impl Module for Gpt {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = scoped("tokens", self.tokens.parameters());
        v.extend(scoped("positions", self.positions.parameters()));
        for (i, b) in self.blocks.iter().enumerate() {
            v.extend(BLOCK.iter().zip(b).map(|(n, t)| (format!("blocks.{i}.{n}"), t.clone())));
        }
        v.extend(scoped("ln_f", self.ln_f.parameters()));
        v.extend(scoped("head", self.head.parameters()));
        v
    }

    fn with_parameters(&self, next: &mut dyn Iterator<Item = Tensor>) -> Result<Self> {
        let tokens = self.tokens.with_parameters(next)?;
        let positions = self.positions.with_parameters(next)?;
        let blocks = (0..self.blocks.len())
            .map(|_| BLOCK.iter().map(|n| take(next, n)).collect::<Result<Vec<_>>>())
            .collect::<Result<Vec<_>>>()?;
        Ok(Gpt {
            config: self.config,
            tokens,
            positions,
            blocks,
            ln_f: self.ln_f.with_parameters(next)?,
            head: self.head.with_parameters(next)?,
        })
    }
}
