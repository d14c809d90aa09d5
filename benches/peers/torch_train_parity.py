#!/usr/bin/env python3
"""Ten AdamW steps of kiln's GPT (`src/nn/gpt.rs`) written in torch, for kiln's parity test.

Why it exists: a compiled train step is only right if it trains as torch does. This script builds the
same model torch users would write (pre-LN blocks, explicit causal attention, erf GELU, a bias-free head,
`F.cross_entropy`, `torch.optim.AdamW`), names its parameters as kiln's `Module::parameters` does, and
writes everything kiln's test (`tests/torch_parity.rs`) needs to repeat the run and compare:

- `<prefix>.init.safetensors`: the initial parameters (f32), by kiln's names; biases and layer-norm
  scales are random rather than GPT-2's zeros and ones, so no gradient is trivially exact;
- `<prefix>.batches.safetensors`: `ids` and `targets` (`(3·id + 1) mod vocab`, a rule ten steps start
  to learn), `[steps, batch, seq]` int64, one batch a step;
- `<prefix>.torch.safetensors`: torch's losses per step and parameters after the last step, in float32
  (`loss`, `f32.<name>`: what a torch user gets) and in float64 from the same start (`loss64`,
  `f64.<name>`: the arithmetic's exact answer up to f64 rounding, against which both float32 runs are
  measured). The metadata holds the model's sizes and the optimizer's hyper-parameters.

It judges nothing: the Rust test does. The committed fixture (`tests/data/parity/`) was written by

    python3 benches/peers/torch_train_parity.py --out tests/data/parity

on the CPU; `--device cuda` and larger sizes (`--dim 768 --heads 12 --layers 4 ...`) run it on a GPU.
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file


class Block(torch.nn.Module):
    """`graph::workloads::gpt_block`: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d, eps=1e-5)
        self.attn = torch.nn.Module()
        self.attn.qkv = torch.nn.Linear(d, 3 * d)
        self.attn.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d, eps=1e-5)
        self.mlp = torch.nn.Module()
        self.mlp.fc = torch.nn.Linear(d, 4 * d)
        self.mlp.proj = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.heads
        qkv = self.attn.qkv(self.ln1(x))
        q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(b, s, self.heads, hd).permute(0, 2, 1, 3) for i in range(3))
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.attn.proj(att.permute(0, 2, 1, 3).reshape(b, s, d))
        return x + self.mlp.proj(F.gelu(self.mlp.fc(self.ln2(x))))


class Gpt(torch.nn.Module):
    """`kiln::nn::Gpt`: token and position embeddings, blocks, a final layer norm, a bias-free head."""

    def __init__(self, vocab, context, dim, heads, layers):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, dim)
        self.positions = torch.nn.Embedding(context, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(dim, eps=1e-5)
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions.weight[: ids.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))

    def loss(self, ids, targets):
        logits = self(ids)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def initialise(model, gen):
    """N(0, 0.02) weights; biases N(0, 0.02); layer-norm scales 1 + N(0, 0.1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if ".ln" in name or name.startswith("ln_f"):
                p.copy_(1.0 + 0.1 * noise if name.endswith("weight") else 0.02 * noise)
            else:
                p.copy_(0.02 * noise)


def train(model, batches, hp, steps):
    """`steps` AdamW steps, one batch each; the loss before each update."""
    opt = torch.optim.AdamW(model.parameters(), lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                            weight_decay=hp["weight_decay"], foreach=False)
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model.loss(batches["ids"][step], batches["targets"][step])
        loss.backward()
        opt.step()
        losses.append(loss.detach().double().item())
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the three safetensors files")
    ap.add_argument("--prefix", default="gpt")
    ap.add_argument("--vocab", type=int, default=32)
    ap.add_argument("--context", type=int, default=8)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    hp = {"lr": a.lr, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    gen = torch.Generator().manual_seed(a.seed)
    model = Gpt(a.vocab, a.context, a.dim, a.heads, a.layers)
    initialise(model, gen)
    init = {n: p.detach().float().contiguous() for n, p in model.named_parameters()}
    shape = (a.steps, a.batch, a.context)
    ids = torch.randint(0, a.vocab, shape, generator=gen)
    # A rule the model can learn in ten steps (the next token is a function of this one), so the run
    # trains rather than fits noise: the losses fall.
    batches = {"ids": ids, "targets": (3 * ids + 1) % a.vocab}

    runs = {}
    for dtype in (torch.float32, torch.float64):
        m = Gpt(a.vocab, a.context, a.dim, a.heads, a.layers).to(a.device, dtype)
        m.load_state_dict({n: t.to(a.device, dtype) for n, t in init.items()})
        on_device = {k: v.to(a.device) for k, v in batches.items()}
        runs[dtype] = (train(m, on_device, hp, a.steps), {n: p.detach().cpu() for n, p in m.named_parameters()})

    os.makedirs(a.out, exist_ok=True)
    meta = {"config": json.dumps({"vocab": a.vocab, "context": a.context, "dim": a.dim, "heads": a.heads,
                                  "layers": a.layers, "batch": a.batch, "steps": a.steps, "seed": a.seed}),
            "adamw": json.dumps(hp), "torch": torch.__version__, "device": a.device}
    save_file(init, os.path.join(a.out, f"{a.prefix}.init.safetensors"), metadata=meta)
    save_file(batches, os.path.join(a.out, f"{a.prefix}.batches.safetensors"), metadata=meta)
    (l32, p32), (l64, p64) = runs[torch.float32], runs[torch.float64]
    result = {"loss": torch.tensor(l32, dtype=torch.float32), "loss64": torch.tensor(l64, dtype=torch.float64)}
    result.update({f"f32.{n}": t.float().contiguous() for n, t in p32.items()})
    result.update({f"f64.{n}": t.double().contiguous() for n, t in p64.items()})
    save_file(result, os.path.join(a.out, f"{a.prefix}.torch.safetensors"), metadata=meta)
    print(json.dumps({"loss_f32": l32, "loss_f64": l64}, indent=1))


if __name__ == "__main__":
    main()
