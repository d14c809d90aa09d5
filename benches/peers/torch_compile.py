#!/usr/bin/env python3
"""PyTorch peer for kiln-bench: kiln's workloads in torch, measured the way kiln measures itself.

Why each piece is here:
- Inputs are kiln's own (`graph/src/workloads.rs::data`, ported bit for bit below), so torch and kiln
  compute on the same numbers and torch's outputs can be checked against kiln's f64 reference.
- Every (workload, mode) gets kiln's two numbers: the device time (CUDA events around `--batch` calls back
  to back, divided by the count; median of `--repeat` samples after a half-second warm-up) and the public
  call (host wall time of one call + synchronize; median of `--repeat`).
- First-call (compile) time is cold or warm according to the Inductor and Triton caches this process
  started with; `scripts/gpu.sh peer --trials N` runs a cold trial and then warm ones.
- With `--outputs DIR` it writes what kiln checks: each workload's output at the measured size computed
  eagerly in float64 (`<id>.expected.safetensors`, kiln's full-size check) and torch's own output in
  every mode at kiln's check size (`<id>.check.<mode>.safetensors`). This file judges nothing itself.

Usage:
  python3 benches/peers/torch_compile.py --json torch.json [--quick] [--workload W1,W2] [--modes eager,default]
      [--outputs DIR] [--repeat 20] [--batch 10] [--device cuda|cpu]
  python3 benches/peers/torch_compile.py --self-test
"""
import argparse
import gc
import json
import math
import os
import platform
import statistics
import struct
import sys
import tempfile
import time
import traceback


def _prepare_caches():
    """Says whether this process starts cold, before torch is imported (Triton reads its cache dir early).

    An unset cache dir becomes a fresh, empty one. The process is cold iff both dirs are empty or missing:
    nothing a previous process compiled can then be found (kiln's cold compile means the same)."""
    dirs = []
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        if not os.environ.get(var):
            os.environ[var] = tempfile.mkdtemp(prefix=f"kiln-peer-{var.split('_')[0].lower()}-")
        dirs.append(os.environ[var])
    cold = all(not os.path.isdir(d) or not os.listdir(d) for d in dirs)
    return "cold" if cold else "warm"


CACHE = _prepare_caches()

import numpy as np  # noqa: E402  (after the cache dirs are set)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

ALL_WORKLOADS = ("W1,W2,W3,W4,W5,W5-sdpa,LG,W5-bf16,W5-bf16-sdpa,W1-bf16,W2-bf16,W3-bf16,W5-train,W5-train-sdpa,"
                 "W5-train-bf16,W5-train-bf16-sdpa,"
                 "W3-dynamic,W6")
ALL_MODES = ["default", "reduce-overhead", "max-autotune-no-cudagraphs", "eager", "regional"]
# What the report's notes must say about rows that did not measure what their mode names.
WARNINGS = []
# kiln's `DYNAMIC_ROWS` (benches/src/timing.rs), in its order.
DYNAMIC_ROWS = [4133, 977, 6211, 2048, 7001, 1500, 3333, 5120, 811, 6007, 2719, 4409, 7777, 1234, 5001, 3001,
                6553, 999, 4096, 8000]

# ---------------------------------------------------------------------------------------------------------
# Inputs: kiln's `workloads::data`, bit for bit.
# ---------------------------------------------------------------------------------------------------------

GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
SEED = 0x5851F42D4C957F2D
MASK64 = (1 << 64) - 1


def _scale(dims):
    """Fan-in scale as Rust computes it, `(1.0 / n).sqrt()`: every 2-D input (x included) by dims[1], a
    4-D input with a kernel of at most 7x7 (a convolution weight) by in-channels x kernel."""
    if len(dims) == 2:
        return math.sqrt(1.0 / dims[1])
    if len(dims) == 4 and dims[2] <= 7 and dims[3] <= 7:
        return math.sqrt(1.0 / (dims[1] * dims[2] * dims[3]))
    return 1.0


def data_f64(dims, salt):
    """kiln's `data(spec, salt)` values before the dtype cast, as float64, vectorised.

    The SplitMix64 state after i+1 steps is `base + (i+1)·GOLDEN (mod 2^64)`, so the whole stream is one
    uint64 array (numpy integer arrays wrap); the float steps run in the same order as Rust's, so every
    f64 is identical."""
    n = math.prod(dims)
    base = np.uint64(((salt * GOLDEN) & MASK64) ^ SEED)
    z = np.arange(1, n + 1, dtype=np.uint64)
    z *= np.uint64(GOLDEN)
    z += base
    z ^= z >> np.uint64(30)
    z *= np.uint64(MIX1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(MIX2)
    z ^= z >> np.uint64(31)
    z >>= np.uint64(11)
    v = z.astype(np.float64)
    del z
    v /= float(1 << 53)
    v *= 4.0
    v -= 2.0
    v *= _scale(dims)
    return v.reshape(dims)


def data_f64_py(dims, salt):
    """The same with Python ints, a line-by-line transcription of the Rust (the self-test's reference)."""
    n = math.prod(dims)
    scale = _scale(dims)
    state = ((salt * GOLDEN) & MASK64) ^ SEED
    out = []
    for _ in range(n):
        state = (state + GOLDEN) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * MIX1) & MASK64
        z = ((z ^ (z >> 27)) * MIX2) & MASK64
        z ^= z >> 31
        out.append((float(z >> 11) / float(1 << 53) * 4.0 - 2.0) * scale)
    return out


def bf16_bits(v):
    """The `half` crate's `bf16::from_f64` (kiln's bf16 cast), bit for bit, as uint16.

    It is not round-to-nearest from the f64: it keeps the f64's upper 32 bits only and rounds those (to
    nearest, ties to even, reading only those bits), so a value just above a tie in the lower 32 bits
    rounds as the tie. Every branch of the Rust is ported (inf/NaN, overflow, subnormal, underflow)."""
    val = np.ascontiguousarray(v, dtype=np.float64).reshape(-1).view(np.uint64)
    x = (val >> np.uint64(32)).astype(np.int64)
    sign, exp, man = x & 0x80000000, x & 0x7FF00000, x & 0x000FFFFF
    half_sign = sign >> 16
    half_exp = (exp >> 20) - 1023 + 127
    # NaN keeps its mantissa's top bits and sets the quiet bit; infinity has neither.
    nan_bit = np.where((man == 0) & ((val & np.uint64(0xFFFFFFFF)) == 0), 0, 0x40)
    special = half_sign | 0x7F80 | nan_bit | (man >> 13)
    # Normal: rebias, keep 7 mantissa bits, round on bit 12 unless it is a tie on an even result.
    round_up = ((man & 0x1000) != 0) & ((man & (3 * 0x1000 - 1)) != 0)
    normal = (half_sign | (np.clip(half_exp, 0, 0xFF) << 7) | (man >> 13)) + round_up
    # Subnormal (-14 <= half_exp <= 0): the hidden bit joins the mantissa, shifted by the exponent.
    e = np.clip(half_exp, -14, 0)
    m = man | 0x100000
    bit = np.left_shift(np.int64(1), 13 - e)
    sub = half_sign | ((m >> (14 - e)) + (((m & bit) != 0) & ((m & (3 * bit - 1)) != 0)))
    out = np.select(
        [exp == 0x7FF00000, half_exp >= 0xFF, half_exp > 0, 7 - half_exp <= 21],
        [special, half_sign | 0x7F80, normal, sub],
        default=half_sign,
    )
    return out.astype(np.uint16).reshape(np.shape(v))


def bf16_bits_py(value):
    """`half`'s `f64_to_bf16` for one value, transcribed line by line (the self-test's reference)."""
    val = struct.unpack("<Q", struct.pack("<d", value))[0]
    x = val >> 32
    sign, exp, man = x & 0x80000000, x & 0x7FF00000, x & 0x000FFFFF
    if exp == 0x7FF00000:
        nan_bit = 0 if man == 0 and (val & 0xFFFFFFFF) == 0 else 0x40
        return (sign >> 16) | 0x7F80 | nan_bit | (man >> 13)
    half_sign = sign >> 16
    half_exp = (exp >> 20) - 1023 + 127
    if half_exp >= 0xFF:
        return half_sign | 0x7F80
    if half_exp <= 0:
        if 7 - half_exp > 21:
            return half_sign
        man |= 0x100000
        half_man = man >> (14 - half_exp)
        round_bit = 1 << (13 - half_exp)
        if (man & round_bit) != 0 and (man & (3 * round_bit - 1)) != 0:
            half_man += 1
        return half_sign | half_man
    half_man = man >> 13
    word = half_sign | (half_exp << 7) | half_man
    if (man & 0x1000) != 0 and (man & (3 * 0x1000 - 1)) != 0:
        word += 1
    return word


def make_tensor(dims, dtype, salt, device):
    """One kiln input on `device`: f32 by round-to-nearest from the f64 (Rust's `as f32`, numpy's
    astype), bf16 from the f64 by `half`'s rule (not via f32), built from its bits."""
    v = data_f64(dims, salt)
    if dtype == "f32":
        t = torch.from_numpy(v.astype(np.float32))
    else:
        t = torch.from_numpy(bf16_bits(v).view(np.int16)).view(torch.bfloat16)
    del v
    return t.to(device)


# ---------------------------------------------------------------------------------------------------------
# Workloads, as `graph/src/workloads.rs` defines them.
# ---------------------------------------------------------------------------------------------------------


def base_id(wid):
    """The workload whose inputs and expected output `wid` shares (an SDPA variant computes the same)."""
    return wid.removesuffix("-sdpa")


def is_train(b):
    """Whether base workload `b` is a training step (W5-train and its bf16 variant)."""
    return b in ("W5-train", "W5-train-bf16")


def specs(wid, size):
    """Input (dims, dtype) in kiln's order for `size` in full / quick / check; the salt is the index."""
    i = {"full": 0, "quick": 1, "check": 2}[size]
    b = base_id(wid)
    # W1–W3's bf16 variants: the same sizes, every input bf16.
    b = b.removesuffix("-bf16") if b in ("W1-bf16", "W2-bf16", "W3-bf16") else b
    if b == "W1":
        dims = [[[1 << 26]], [[1 << 20]], [[100_003]]][i]
    elif b == "W2":
        dims = [[[8192, 8192]], [[1024, 1024]], [[64, 8192]]][i]
    elif b == "W3":
        m, n = [(8192, 4096), (1024, 1024), (64, 4096)][i]
        dims = [[m, n], [n], [n]]
    elif b == "LG":
        dims = [[[4096, 4096], [4096, 4096], [4096]], [[256, 256], [256, 256], [256]],
                [[64, 512], [256, 512], [256]]][i]
    elif b == "W4":
        dims = [[10, 10]] + [[10, 10], [10]] * 129
    elif b in ("W5", "W5-bf16") or is_train(b):
        bsz, s, d = [(8, 512, 768), (2, 64, 128), (1, 16, 128)][i]
        block = [[d], [d], [3 * d, d], [3 * d], [d, d], [d], [d], [d], [4 * d, d], [4 * d], [d, 4 * d], [d]]
        params = block * 4 + [[d], [d]]
        dims = [[bsz, s, d]] + params
        if is_train(b):
            # benches/src/train_step.rs: x, the parameters, the target y, the first moments, the roots r
            # of the second moments (v = r²).
            dims += [[bsz, s, d]] + params + params
    elif b == "W6":
        bsz, hw = [(16, 128), (2, 64), (1, 32)][i]
        dims = w6_specs(bsz, hw)
    else:
        raise ValueError(f"unknown workload {wid}")
    dtype = "bf16" if base_id(wid).endswith("-bf16") else "f32"
    return [(list(x), dtype) for x in dims]


W6_BLOCKS = (6, 12, 24, 16)
W6_GROWTH = 32


def w6_specs(bsz, hw):
    """workloads.rs `w6_inputs`: images, then DenseNet-121's parameters in the order W6 reads them."""
    bn = lambda c: [[c], [c], [c], [c]]  # noqa: E731 (weight, bias, running mean, running variance)
    dims = [[bsz, 3, hw, hw], [64, 3, 7, 7]] + bn(64)
    c = 64
    for i, layers in enumerate(W6_BLOCKS):
        for _ in range(layers):
            dims += bn(c) + [[4 * W6_GROWTH, c, 1, 1]] + bn(4 * W6_GROWTH) + [[W6_GROWTH, 4 * W6_GROWTH, 3, 3]]
            c += W6_GROWTH
        if i + 1 < len(W6_BLOCKS):
            dims += bn(c) + [[c // 2, c, 1, 1]]
            c //= 2
    return dims + bn(c) + [[1000, c], [1000]]


def inputs(wid, size, device):
    return [make_tensor(dims, dt, salt, device) for salt, (dims, dt) in enumerate(specs(wid, size))]


def w1(x):
    return F.gelu(x * 1.5 + 0.5) * torch.sigmoid(x) - torch.tanh(x)


def w2(x):
    return torch.softmax(x, dim=-1)


def w3(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b, 1e-5))


def lg(x, w, b):
    return F.gelu(F.linear(x, w, b))


def _param(t):
    # A Parameter over the input tensor itself (same storage): the module holds kiln's values, no copy. A
    # train step's parameters (which require grad) are used as they are.
    if isinstance(t, torch.nn.Parameter):
        return t
    return torch.nn.Parameter(t, requires_grad=False)


def _linear(w, b):
    """nn.Linear holding kiln's w ([out, in], as nn.Linear stores it) and b; built on the meta device so
    no random initialisation runs."""
    lin = torch.nn.Linear(w.shape[1], w.shape[0], device="meta")
    lin.weight, lin.bias = _param(w), _param(b)
    return lin


def _layer_norm(w, b):
    ln = torch.nn.LayerNorm(w.shape[0], eps=1e-5, device="meta")
    ln.weight, ln.bias = _param(w), _param(b)
    return ln


class Layer(torch.nn.Module):
    """One of W4's 64 layers: Linear → ReLU → sigmoid → Linear → ReLU.

    A user-defined block, not an nn.Sequential: dynamo skips frames of torch.nn's own modules, so on
    torch 2.11 `Sequential.compile()` compiles nothing (its calls stay eager, behind the compile wrapper);
    torch's regional-compilation recipe compiles the user's repeated block, as here."""

    def __init__(self, a_w, a_b, b_w, b_b):
        super().__init__()
        self.a, self.b = _linear(a_w, a_b), _linear(b_w, b_b)

    def forward(self, x):
        return torch.relu(self.b(torch.sigmoid(torch.relu(self.a(x)))))


class W4(torch.nn.Module):
    """`Linear(10,10)` then 64 × [Linear → ReLU → sigmoid → Linear → ReLU]; t = x, then (w, b) pairs."""

    def __init__(self, t):
        super().__init__()
        self.first = _linear(t[1], t[2])
        self.layers = torch.nn.ModuleList(Layer(*t[p:p + 4]) for p in (3 + 4 * layer for layer in range(64)))

    def forward(self, x):
        x = self.first(x)
        for layer in self.layers:
            x = layer(x)
        return x


class Block(torch.nn.Module):
    """kiln's `gpt_block`: pre-LN, causal attention, exact-erf GELU MLP. `p` = ln1 w/b, qkv w/b, proj w/b,
    ln2 w/b, fc1 w/b, fc2 w/b. `sdpa` picks F.scaled_dot_product_attention over the explicit form."""

    def __init__(self, p, heads, seq, sdpa):
        super().__init__()
        self.ln1, self.qkv, self.proj = _layer_norm(p[0], p[1]), _linear(p[2], p[3]), _linear(p[4], p[5])
        self.ln2, self.fc1, self.fc2 = _layer_norm(p[6], p[7]), _linear(p[8], p[9]), _linear(p[10], p[11])
        self.heads, self.sdpa = heads, sdpa
        # Masked positions (key after query), built once as a model would (nanoGPT keeps it as a buffer).
        self.register_buffer("masked", torch.ones(seq, seq, dtype=torch.bool, device=p[0].device).triu(1),
                             persistent=False)

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
            a = att.masked_fill(self.masked, float("-inf")).softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _conv(w, stride, pad):
    conv = torch.nn.Conv2d(w.shape[1], w.shape[0], w.shape[2], stride, pad, bias=False, device="meta")
    conv.weight = _param(w)
    return conv


def _bn(p):
    """nn.BatchNorm2d (eval) over kiln's weight, bias, mean; the running variance is `|var| + 1` (kiln's
    W6 makes its uniform [-2, 2) input positive the same way)."""
    bn = torch.nn.BatchNorm2d(p[0].shape[0], eps=1e-5, device="meta")
    bn.weight, bn.bias = _param(p[0]), _param(p[1])
    bn.register_buffer("running_mean", p[2])
    bn.register_buffer("running_var", p[3].abs() + 1.0)
    bn.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long, device=p[0].device))
    return bn


class DenseLayer(torch.nn.Module):
    """torchvision's `_DenseLayer`: concatenate the earlier features, BN-ReLU-1x1 conv-BN-ReLU-3x3 conv."""

    def __init__(self, p):
        super().__init__()
        self.norm1, self.conv1 = _bn(p[0:4]), _conv(p[4][0], 1, 0)
        self.norm2, self.conv2 = _bn(p[5:9]), _conv(p[9][0], 1, 1)

    def forward(self, features):
        h = torch.cat(features, 1)
        h = self.conv1(F.relu(self.norm1(h)))
        return self.conv2(F.relu(self.norm2(h)))


class W6(torch.nn.Module):
    """DenseNet-121 in eval mode, layer for layer as torchvision builds it; t as `w6_specs` lists it."""

    def __init__(self, t):
        super().__init__()
        it = iter(t[1:])
        take = lambda n: [next(it) for _ in range(n)]  # noqa: E731
        self.conv0, self.norm0 = _conv(take(1)[0], 2, 3), _bn(take(4))
        self.blocks = torch.nn.ModuleList()
        self.transitions = torch.nn.ModuleList()
        for i, layers in enumerate(W6_BLOCKS):
            self.blocks.append(torch.nn.ModuleList(DenseLayer([*take(4), take(1), *take(4), take(1)])
                                                   for _ in range(layers)))
            if i + 1 < len(W6_BLOCKS):
                self.transitions.append(torch.nn.ModuleList([_bn(take(4)), _conv(take(1)[0], 1, 0)]))
        self.norm5 = _bn(take(4))
        self.classifier = _linear(*take(2))

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.norm0(self.conv0(x))), 3, 2, 1)
        for i, block in enumerate(self.blocks):
            features = [x]
            for layer in block:
                features.append(layer(features))
            x = torch.cat(features, 1)
            if i < len(self.transitions):
                bn, conv = self.transitions[i]
                x = F.avg_pool2d(conv(F.relu(bn(x))), 2, 2)
        x = F.adaptive_avg_pool2d(F.relu(self.norm5(x)), 1).flatten(1)
        return self.classifier(x)


class W5(torch.nn.Module):
    """4 blocks then a final layer norm; t = x [b, s, d], 4 × 12 block parameters, final w/b."""

    def __init__(self, t, sdpa):
        super().__init__()
        _, s, d = t[0].shape
        heads = max(d // 64, 1)
        self.blocks = torch.nn.ModuleList(Block(t[1 + 12 * i:13 + 12 * i], heads, s, sdpa) for i in range(4))
        self.ln = _layer_norm(t[49], t[50])

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x)


class TrainStep:
    """kiln's W5-train (`benches/src/train_step.rs`) as a torch user writes a training step: W5's module
    (compiled in `mode`, None: eager) over parameters that require grad, `F.mse_loss`, `backward()`, and
    torch.optim.AdamW's step (fused on CUDA: its fastest form) with torch's default hyper-parameters and
    lr 1e-3. The optimizer's state is kiln's: first moments m, second moments r², 9 steps taken, so the
    call is step 10, as kiln's step is. Parameters and moments are copies of `t` (timing steps change
    them; `t` stays the inputs the expected outputs are computed from). Called with (x, y); returns the
    loss; `outputs` lists what kiln's step returns (loss, parameters, m, v)."""

    PARAMS = 50

    def __init__(self, t, sdpa, mode, fused):
        n = self.PARAMS
        self.initial = [x.detach().clone() for x in t[1:1 + n]] + [x.detach().clone() for x in t[2 + n:2 + 2 * n]] \
            + [(r * r).detach() for r in t[2 + 2 * n:]]
        self.params = [torch.nn.Parameter(p.clone()) for p in t[1:1 + n]]
        model = W5([t[0]] + self.params, sdpa)
        self.model = model if mode is None else torch.compile(model, mode=None if mode == "default" else mode)
        self.opt = torch.optim.AdamW(self.params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                     fused=fused, foreach=False if not fused else None)
        for p in self.params:
            # The state AdamW would have made itself (its _init_group skips a parameter with state): the
            # step count on the device for the fused kernel, on the host otherwise.
            self.opt.state[p] = {
                "step": torch.tensor(0.0, dtype=torch.float32, device=p.device if fused else "cpu"),
                "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p),
            }
        self.reset()

    def reset(self):
        """Parameters and state back to the inputs' values, in place (CUDA graphs keep their addresses)."""
        n = self.PARAMS
        with torch.no_grad():
            for i, p in enumerate(self.params):
                st = self.opt.state[p]
                p.copy_(self.initial[i])
                st["exp_avg"].copy_(self.initial[n + i])
                st["exp_avg_sq"].copy_(self.initial[2 * n + i])
                st["step"].fill_(9.0)

    def __call__(self, x, y):
        with torch.enable_grad():
            self.opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(self.model(x), y)
            loss.backward()
            self.opt.step()
        return loss.detach()

    def outputs(self, loss):
        """kiln's outputs after one step: the loss, the parameters, the first and the second moments."""
        st = [self.opt.state[p] for p in self.params]
        return [loss] + [p.detach() for p in self.params] + [s["exp_avg"] for s in st] \
            + [s["exp_avg_sq"] for s in st]


def train_step(mode, wid, t):
    """W5-train in `mode` (None: eager): the step and its arguments (x, y)."""
    n = TrainStep.PARAMS
    step = TrainStep(t, sdpa=wid.endswith("-sdpa"), mode=mode, fused=t[0].is_cuda and t[0].dtype != torch.float64)
    return step, [t[0], t[1 + n]]


def build(wid, t):
    """The eager callable for `wid` over inputs `t`, and the arguments it is called with (W4 and W5 hold
    their weights as module parameters, as torch users write them; they are called with x alone)."""
    b = base_id(wid)
    if is_train(b):
        return train_step(None, wid, t)
    if b in ("W4", "W5", "W5-bf16", "W6"):
        model = W4(t) if b == "W4" else W6(t) if b == "W6" else W5(t, sdpa=wid.endswith("-sdpa"))
        return model.eval(), [t[0]]
    return {"W1": w1, "W2": w2, "W3": w3, "LG": lg}[b.removesuffix("-bf16")], list(t)


def flops(wid, t):
    """FLOPs where matmuls dominate, as workloads.rs counts them (`linear_flops`, `w5_flops`, W4's)."""
    b = base_id(wid)
    if b == "LG":
        (m, k), n = t[0].shape, t[1].shape[0]
        return 2.0 * m * k * n
    if b in ("W5", "W5-bf16") or is_train(b):
        bs, n, d = (float(s) for s in t[0].shape)
        block = 2 * bs * n * d * 3 * d + 2 * 2 * bs * n * n * d + 2 * bs * n * d * d + 2 * 2 * bs * n * d * 4 * d
        # A train step: the forward and the backward's two matmuls per forward matmul (train_step.rs).
        return 4.0 * block * (3.0 if is_train(b) else 1.0)
    if b == "W4":
        return 129.0 * 2.0 * t[0].numel() * 10.0
    if b == "W6":
        bs, hw = float(t[0].shape[0]), t[0].shape[2] / 4.0

        def conv(cin, cout, k, out):
            return 2.0 * bs * cin * cout * k * k * out * out

        total, c = conv(3, 64, 7, hw * 2), 64
        for i, layers in enumerate(W6_BLOCKS):
            for _ in range(layers):
                total += conv(c, 128, 1, hw) + conv(128, 32, 3, hw)
                c += 32
            if i + 1 < len(W6_BLOCKS):
                total += conv(c, c // 2, 1, hw)
                c //= 2
                hw /= 2.0
        return total + 2.0 * bs * c * 1000.0
    return None


# ---------------------------------------------------------------------------------------------------------
# Modes and measurement.
# ---------------------------------------------------------------------------------------------------------


def modes_for(wid, selected):
    """The selected modes that apply to `wid`, in the fixed order (regional: W4's repeated layers only)."""
    return [m for m in ALL_MODES if m in selected and (m != "regional" or base_id(wid) == "W4")]


def make_fn(mode, wid, t):
    """`wid` over inputs `t` in `mode`: the callable and its arguments. Compilation is lazy (first call)."""
    if is_train(base_id(wid)):
        step, args = train_step(None if mode == "eager" else mode, wid, t)
        if mode == "reduce-overhead":
            for a in args:
                torch._dynamo.mark_static_address(a)
        return step, args
    fn, args = build(wid, t)
    if mode == "eager":
        return fn, args
    if mode == "regional":
        # torch's recipe for repeated layers: compile each layer (default mode); dynamo compiles the layer
        # once and reuses it for the other 63 (their parameters are graph inputs; the row's progress line
        # says how many graphs were compiled).
        for layer in fn.layers:
            layer.compile()
        return fn, args
    if mode == "reduce-overhead":
        # The inputs keep their addresses across calls: marked static, the CUDA graph replays read them in
        # place instead of copying them into its own buffers (parameters are static already). Under
        # no_grad nothing awaits a backward, so each call starts a new cudagraph-tree generation by itself:
        # torch.compiler.cudagraph_mark_step_begin() is not needed (outputs are not kept across calls).
        for a in args:
            torch._dynamo.mark_static_address(a)
    return torch.compile(fn, mode=None if mode == "default" else mode), args


def unmark_static(ts):
    """Undoes mark_static_address (the attribute it sets) so later modes see plain inputs."""
    for x in ts:
        if hasattr(x, "_dynamo_static_input_type"):
            del x._dynamo_static_input_type


class Device:
    """CUDA: device time by CUDA events, peak memory by the allocator's counters. CPU (smoke tests):
    perf_counter (the CPU runs synchronously), no peak memory, no CUDA graphs."""

    def __init__(self, kind):
        self.kind = kind
        self.cuda = kind == "cuda"
        if self.cuda and not torch.cuda.is_available():
            sys.exit("torch_compile.py: CUDA is not available (use --device cpu for a smoke test)")

    def name(self):
        if self.cuda:
            return torch.cuda.get_device_name()
        return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def timing(self, batch):
        return f"{'CUDA events' if self.cuda else 'perf_counter'}, {batch} calls back to back"

    def batch_ms(self, fn, args, batch):
        """One sample: `batch` calls back to back between two timestamps, ms per call."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(batch):
                fn(*args)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / batch
        t = time.perf_counter()
        for _ in range(batch):
            fn(*args)
        return (time.perf_counter() - t) * 1e3 / batch

    def reset_peak(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak(self):
        # Live tensors' high-water mark (CUDA-graph pools included), not the allocator's cached blocks.
        return torch.cuda.max_memory_allocated() if self.cuda else None

    def tidy(self):
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


def warm_up(dev, fn, args):
    """At least half a second and three calls, as kiln-bench: an idle GPU runs its first milliseconds at
    lower clocks, which a fixed short warm-up does not cover."""
    t, n = time.perf_counter(), 0
    while n < 3 or time.perf_counter() - t < 0.5:
        fn(*args)
        dev.sync()
        n += 1


def device_ms(dev, fn, args, repeat, batch):
    """Device time of one call: median of `repeat` samples of `batch` calls back to back (kiln's method)."""
    warm_up(dev, fn, args)
    return statistics.median(dev.batch_ms(fn, args, batch) for _ in range(max(repeat, 1)))


def call_ms(dev, fn, args, repeat):
    """The user's call on inputs already on the device, then a synchronize: host wall time, median of
    `repeat` after the same warm-up (kiln's public call)."""
    warm_up(dev, fn, args)
    samples = []
    for _ in range(max(repeat, 1)):
        t = time.perf_counter()
        fn(*args)
        dev.sync()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def copy_gbps(dev, quick, repeat, batch):
    """GB/s of a plain device copy over 2^26 f32 (2^22 quick), read once and written once, as kiln's."""
    n = 1 << (22 if quick else 26)
    x = torch.zeros(n, device=dev.kind)
    y = torch.empty_like(x)
    ms = device_ms(dev, y.copy_, [x], repeat, batch)
    return 2 * n * 4 / (ms / 1e3) / 1e9


def graphs_compiled():
    """Graphs dynamo has compiled in this process: `counters["stats"]["unique_graphs"]`, which
    convert_frame bumps once per graph it hands to the backend (a recompile or a graph break adds one)."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def row(wid, dev, mode, median, timing, call, nbytes=0, gbps=0.0, frac=0.0, tflops=None, compile_ms=None,
        peak=None, recompiles=None):
    """A kiln-bench/2 result row; the checks stay null (kiln fills them from the check files)."""
    return {
        "workload": wid, "backend": f"torch-{dev.kind}", "mode": mode, "median_ms": median, "timing": timing,
        "call_ms": call, "max_rel_err": None, "correct": None, "kernels": None, "bytes": int(nbytes),
        "traffic_bytes": 0, "gbps": gbps, "frac_copy": frac, "tflops": tflops,
        "cold_compile_ms": compile_ms if CACHE == "cold" else None,
        "warm_compile_ms": compile_ms if CACHE == "warm" else None,
        "peak_bytes": peak, "recompiles": recompiles, "trials": 1,
    }


def measure(dev, wid, mode, t, args_cli, copy):
    """One (workload, mode) at the measured size: first call (compile), device time, public call, peak."""
    torch._dynamo.reset()
    dev.tidy()
    before = graphs_compiled()
    t0 = time.perf_counter()
    fn, args = make_fn(mode, wid, t)
    out = fn(*args)
    dev.sync()
    first = (time.perf_counter() - t0) * 1e3
    # Read the size now: a CUDA-graph replay would overwrite this output later.
    nbytes = sum(x.numel() * x.element_size() for x in t) + out.numel() * out.element_size()
    del out
    # From after the first call: compile-time buffers (Triton's benchmarking allocates an L2-sized flush
    # buffer) are not the configuration's memory, and kiln's peak starts after its compile too.
    dev.reset_peak()
    ms = device_ms(dev, fn, args, args_cli.repeat, args_cli.batch)
    call = call_ms(dev, fn, args, args_cli.repeat)
    peak = dev.peak()
    graphs = graphs_compiled() - before
    if mode == "reduce-overhead":
        unmark_static(args)
    del fn, args
    if mode != "eager" and graphs == 0:
        # A compile that compiled nothing times eager code behind a compile wrapper: say so.
        WARNINGS.append(f"{wid} {mode}: dynamo compiled no graph (the row times eager code)")
        print(f"WARNING: {WARNINGS[-1]}", flush=True)
    gbps = nbytes / (ms / 1e3) / 1e9
    f = flops(wid, t)
    r = row(wid, dev, mode, ms, dev.timing(args_cli.batch), call, nbytes, gbps, gbps / copy,
            f / (ms / 1e3) / 1e12 if f is not None else None, None if mode == "eager" else first, peak)
    print(f"{wid} {mode}: device {ms:.4f} ms, call + sync {call:.4f} ms, {gbps:.0f} GB/s "
          f"({100 * gbps / copy:.0f}% of copy), first call {first:.0f} ms ({CACHE} caches), "
          f"{graphs} graph(s) compiled, peak {'—' if peak is None else f'{peak / 2**20:.0f} MiB'}", flush=True)
    return r


def measure_dynamic(dev, args_cli):
    """W3 over kiln's 20 row counts through one torch.compile(w3) (dynamic=None: the first size compiles
    static, a new size recompiles with a symbolic row count). Per size: the first call, then `--repeat`
    calls, each host wall time + sync (kiln's measure_dynamic does the same)."""
    cols = 1024 if args_cli.quick else 4096
    torch._dynamo.reset()
    dev.tidy()
    before = graphs_compiled()
    f = torch.compile(w3, dynamic=None)
    compile_ms, per_size = 0.0, []
    for rows in DYNAMIC_ROWS:
        rows = rows // 8 if args_cli.quick else rows
        t = [make_tensor(dims, "f32", salt, dev.kind) for salt, dims in enumerate([[rows, cols], [cols], [cols]])]
        start = time.perf_counter()
        f(*t)
        dev.sync()
        first = (time.perf_counter() - start) * 1e3
        samples = []
        for _ in range(max(args_cli.repeat, 1)):
            start = time.perf_counter()
            f(*t)
            dev.sync()
            samples.append((time.perf_counter() - start) * 1e3)
        steady = statistics.median(samples)
        compile_ms += max(first - steady, 0.0)
        per_size.append(steady)
        del t
    graphs = graphs_compiled() - before
    ms = statistics.median(per_size)
    print(f"W3-dynamic default, dynamic=None: call + sync {ms:.4f} ms (median over sizes), compile {compile_ms:.0f} ms "
          f"({CACHE} caches), {graphs} graph(s) compiled", flush=True)
    return row("W3-dynamic", dev, "default, dynamic=None", ms, "host wall time, call + sync, 20 row counts", ms,
               compile_ms=compile_ms, recompiles=graphs)


def save(path, outs):
    """Tensors `outs` as F32 (bf16 and f64 cast; kiln reads them back as f64) named `out`, `out.1`, … in
    order (a train step has many outputs; the others one)."""
    save_file({("out" if i == 0 else f"out.{i}"): o.detach().to(torch.float32).contiguous().cpu()
               for i, o in enumerate(outs)}, path)


def all_outputs(fn, out):
    """Every output kiln's version returns: a train step's state after the call, else the one output."""
    return fn.outputs(out) if isinstance(fn, TrainStep) else [out]


def write_expected(dev, wid, t, outdir):
    """`wid`'s output at the measured size, eager in float64 on the device from the same input values (bf16
    upcast exactly), with the explicit attention form (the SDPA variants share it), cast to f32."""
    b = base_id(wid)
    fn, args = build(b, [x.double() for x in t])
    out = fn(*args)
    save(os.path.join(outdir, f"{b}.expected.safetensors"), all_outputs(fn, out))
    del fn, args, out


def write_check(dev, wid, mode, outdir):
    """Torch's own output in `mode` at kiln's check size, compiled afresh (after every timing, so no timed
    compile found a check-size kernel in the caches). Three calls (CUDA graphs record on a later call than
    the first); the last call's output is kept."""
    torch._dynamo.reset()
    t = inputs(wid, "check", dev.kind)
    fn, args = make_fn(mode, wid, t)
    out = None
    for _ in range(3):
        out = None
        if isinstance(fn, TrainStep):
            # kiln checks one step from its inputs: the earlier calls compiled and recorded.
            fn.reset()
        out = fn(*args)
    dev.sync()
    save(os.path.join(outdir, f"{wid}.check.{mode}.safetensors"), all_outputs(fn, out))
    if mode == "reduce-overhead":
        unmark_static(args)
    del fn, args, out, t


# ---------------------------------------------------------------------------------------------------------
# Self-test and main.
# ---------------------------------------------------------------------------------------------------------


def self_test():
    """The vectorised generator and bf16 cast against their line-by-line Python transcriptions, and the
    bf16 cast against torch's own round-to-nearest where the two must agree (values with zero low 32 bits)."""
    cases = [([3, 5], 7), ([10], 0), ([4099], 1), ([64, 50], 2), ([10, 10], 3), ([2, 3, 400], 12345),
             ([1000], 2**40 + 17), ([7, 300], 129)]
    total = 0
    for dims, salt in cases:
        want = np.array(data_f64_py(dims, salt), dtype=np.float64)
        got = data_f64(dims, salt).reshape(-1)
        assert np.array_equal(got.view(np.uint64), want.view(np.uint64)), f"f64 values differ: {dims} salt {salt}"
        f32_py = np.array([struct.unpack("<I", struct.pack("<f", v))[0] for v in want], dtype=np.uint32)
        assert np.array_equal(got.astype(np.float32).view(np.uint32), f32_py), f"f32 cast differs: {dims} {salt}"
        bf_py = np.array([bf16_bits_py(v) for v in want], dtype=np.uint16)
        assert np.array_equal(bf16_bits(got), bf_py), f"bf16 cast differs: {dims} salt {salt}"
        total += len(want)
    # Every branch of the bf16 cast: ties, ties broken by the low 32 bits (ignored), subnormals, limits.
    odd = [0.0, -0.0, 1.0, -1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-40, 1 + 2**-8 + 2**-30, 1 - 2**-10,
           2**-126, 2**-127, 2**-130, 1.5 * 2**-133, 2**-134, 2**-140, 1e-300, 3.3e38, 3.4e38, 1e39, -1e300,
           float("inf"), float("-inf"), float("nan"), 5e-324, -2**-135 * 3]
    rng = np.random.default_rng(0)
    odd += list(rng.standard_normal(5000) * np.exp2(rng.integers(-150, 130, 5000)))
    odd_np = np.array(odd, dtype=np.float64)
    assert np.array_equal(bf16_bits(odd_np), np.array([bf16_bits_py(v) for v in odd], dtype=np.uint16)), "bf16 edges"
    f32s = data_f64([5000], 9).astype(np.float32)
    torch_rne = torch.from_numpy(f32s).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(bf16_bits(f32s.astype(np.float64)), torch_rne), "bf16 of f32-exact values vs torch"
    # The bits become the bf16 tensor unchanged.
    bits = bf16_bits(data_f64([257], 4))
    t = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    back = t.float().numpy().view(np.uint32)
    assert np.array_equal(back, bits.astype(np.uint32) << 16), "bf16 tensor bits"
    print(f"self-test: {total} generated values (f64, f32, bf16) and {len(odd) + 5000} bf16 casts agree")
    for dims, salt in [([3, 5], 7), ([10], 0)]:
        v = data_f64_py(dims, salt)[:4]
        f32 = [struct.unpack("<f", struct.pack("<f", x))[0] for x in v]
        print(f"data({dims}, salt {salt})[:4]: f64 {[repr(x) for x in v]}; f32 {[f'{x:.9g}' for x in f32]}; "
              f"f32 bits {[hex(struct.unpack('<I', struct.pack('<f', x))[0]) for x in v]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="where the kiln-bench/2 report goes")
    ap.add_argument("--quick", action="store_true", help="kiln's --quick sizes")
    ap.add_argument("--repeat", type=int, default=20, help="samples per number (median)")
    ap.add_argument("--batch", type=int, default=10, help="calls back to back per device-time sample")
    ap.add_argument("--workload", default=ALL_WORKLOADS)
    ap.add_argument("--modes", default=",".join(ALL_MODES))
    ap.add_argument("--outputs", help="directory for <id>.expected.safetensors and <id>.check.<mode>.safetensors")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: smoke tests only")
    ap.add_argument("--self-test", action="store_true", help="check the input generator and exit")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return 0
    if not a.json:
        ap.error("--json is required")
    selected = a.modes.split(",")
    unknown = [m for m in selected if m not in ALL_MODES]
    if unknown:
        ap.error(f"unknown modes {unknown}; known: {ALL_MODES}")
    workloads = a.workload.split(",")
    dev = Device(a.device)
    if a.outputs:
        os.makedirs(a.outputs, exist_ok=True)
    size = "quick" if a.quick else "full"
    notes = [
        "Inputs are kiln's workloads::data (SplitMix64 seeded by the input's index), bit-identical: f32 by "
        "round-to-nearest, bf16 by the half crate's from_f64 from the f64 values; W4 and W5 hold them as "
        "their modules' parameters.",
        f"Device time: {dev.timing(a.batch)}, divided by {a.batch}, median of {a.repeat} samples after a warm-up "
        f"of at least 0.5 s and 3 calls; call: host wall time of one call + synchronize, median of {a.repeat} "
        "after the same warm-up; all on inputs already on the device, under torch.no_grad() (W5-train: with "
        "grad, inside its step).",
        f"Compile (first call, compile included) is {CACHE}: this process started with "
        f"{'empty' if CACHE == 'cold' else 'populated'} Inductor and Triton caches. `default` runs first for "
        "each workload, so its cold compile finds none of that workload's kernels; later modes (and W5-sdpa "
        "after W5) may reuse kernels compiled earlier in the same process.",
        "reduce-overhead: inputs marked with torch._dynamo.mark_static_address (replays copy nothing); the "
        "CUDA graph is recorded on a later call than the first, so its first-call time leaves the capture out.",
        "regional (W4): each of the 64 layers (a user-defined block class: torch 2.11 does not compile "
        "torch.nn's own Sequential) compiled with .compile(), default mode.",
        f"f32 matmuls at torch's default precision (float32_matmul_precision '{torch.get_float32_matmul_precision()}'); "
        f"f32 convolutions at cuDNN's default (torch.backends.cudnn.allow_tf32 = {torch.backends.cudnn.allow_tf32}: "
        "TF32 when True).",
        "peak_bytes: torch.cuda.max_memory_allocated() from after the first call (compile-time buffers such as "
        "Triton's L2 flush buffer left out) to after the timing; live tensors (inputs included), CUDA-graph "
        "pools and cuBLAS's workspace, not the allocator's cache.",
        "max_rel_err / correct are left to kiln: it checks <id>.check.<mode>.safetensors (torch's own output "
        "at kiln's check size) against its f64 reference; W3-dynamic writes no check file.",
        "W3-dynamic: graphs compiled = torch._dynamo.utils.counters['stats']['unique_graphs'] over the run; "
        "compile = sum over sizes of (first call − that size's median call).",
    ]
    if not dev.cuda:
        notes.append("CPU smoke run: perf_counter timing, no peak memory, no CUDA graphs (reduce-overhead "
                     "compiles without them).")
    failed = []
    results = []
    with torch.no_grad():
        copy = copy_gbps(dev, a.quick, a.repeat, a.batch)
        print(f"torch {torch.__version__} on {dev.name()}: copy {copy:.0f} GB/s; caches {CACHE}", flush=True)
        ran = {}
        expected_done = set()
        for wid in workloads:
            if wid == "W3-dynamic":
                try:
                    results.append(measure_dynamic(dev, a))
                except Exception as e:  # noqa: BLE001  (one failure must not lose the other rows)
                    traceback.print_exc()
                    failed.append(f"W3-dynamic: {type(e).__name__}: {e}")
                continue
            t = inputs(wid, size, dev.kind)
            ran[wid] = []
            for mode in modes_for(wid, selected):
                try:
                    results.append(measure(dev, wid, mode, t, a, copy))
                    ran[wid].append(mode)
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    failed.append(f"{wid} {mode}: {type(e).__name__}: {e}")
                    torch._dynamo.reset()
            if a.outputs and base_id(wid) not in expected_done:
                write_expected(dev, wid, t, a.outputs)
                expected_done.add(base_id(wid))
            del t
            dev.tidy()
        # The check-size outputs come last, so no timed compile ever found a check-size kernel cached.
        if a.outputs:
            for wid, modes in ran.items():
                for mode in modes:
                    try:
                        write_check(dev, wid, mode, a.outputs)
                    except Exception as e:  # noqa: BLE001
                        traceback.print_exc()
                        failed.append(f"{wid} {mode} (check size): {type(e).__name__}: {e}")
                dev.tidy()
            print(f"outputs in {a.outputs}", flush=True)
    notes += WARNINGS + [f"failed: {f}" for f in failed]
    report = {
        "schema": "kiln-bench/2", "peer": "torch " + torch.__version__, "quick": a.quick, "devices": [dev.name()],
        "copy_gbps": {f"torch-{dev.kind}": copy}, "cache": CACHE, "batch": a.batch, "outputs": a.outputs,
        "results": results, "notes": notes,
    }
    if os.path.dirname(a.json):
        os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(report, f, indent=2, allow_nan=False)
    for f in failed:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
