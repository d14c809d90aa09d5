#!/usr/bin/env python3
"""PyTorch peer for kiln-bench: the same workloads in eager, torch.compile (default) and torch.compile
(mode="reduce-overhead"), timed with CUDA events (median of --repeat runs after warm-up), written in kiln's
report schema so the bench can merge them side by side.

Usage: python3 benches/peers/torch_compile.py --json torch.json [--quick] [--workload W1,W2]
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F


def w1(x):
    return F.gelu(x * 1.5 + 0.5) * torch.sigmoid(x) - torch.tanh(x)


def w2(x):
    return torch.softmax(x, dim=-1)


def w3(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b, 1e-5))


def lg(x, w, b):
    return F.gelu(F.linear(x, w, b))


class W4(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(10, 10)
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.ReLU(), torch.nn.Sigmoid(),
                                torch.nn.Linear(10, 10), torch.nn.ReLU()) for _ in range(64))

    def forward(self, x):
        x = self.first(x)
        for layer in self.layers:
            x = layer(x)
        return x


class Block(torch.nn.Module):
    """Pre-LN GPT block; `sdpa` picks F.scaled_dot_product_attention instead of the explicit form."""

    def __init__(self, d, heads, sdpa):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.heads, self.sdpa = heads, sdpa

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            a = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class W5(torch.nn.Module):
    def __init__(self, d=768, sdpa=False):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d, d // 64, sdpa) for _ in range(4))
        self.ln = torch.nn.LayerNorm(d)

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x)


def inputs(wid, quick, dev):
    g = torch.Generator(device="cpu").manual_seed(0)
    r = lambda *s: (torch.rand(*s, generator=g) * 4 - 2).to(dev)
    if wid == "W1":
        return [r(1 << (20 if quick else 26))]
    if wid == "W2":
        n = 1024 if quick else 8192
        return [r(n, n)]
    if wid == "W3":
        m, n = (1024, 1024) if quick else (8192, 4096)
        return [r(m, n), r(n), r(n)]
    if wid.startswith("W5"):
        return [r(2, 64, 128) if quick else r(8, 512, 768)]
    if wid == "LG":
        n = 256 if quick else 4096
        return [r(n, n), r(n, n) / math.sqrt(n), r(n)]
    return [r(10, 10)]


def bytes_moved(wid, xs, out):
    # What the ideal fused kernel reads and writes: every input once, the output once.
    return sum(x.numel() * x.element_size() for x in xs) + out.numel() * out.element_size()


def warm_up(fn, xs):
    # At least half a second, as kiln-bench does, so both run at steady clocks.
    t0, n = time.perf_counter(), 0
    while n < 3 or time.perf_counter() - t0 < 0.5:
        fn(*xs)
        torch.cuda.synchronize()
        n += 1


def timed(fn, xs, repeat):
    warm_up(fn, xs)
    samples = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*xs)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def public_call(fn, xs, repeat):
    """The user's call as a user makes it: the call on inputs already on the GPU, then a synchronize;
    host wall time, median after the same warm-up (kiln-bench's "public call" row)."""
    warm_up(fn, xs)
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(*xs)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def copy_gbps(quick, repeat):
    n = 1 << (22 if quick else 26)
    x = torch.empty(n, device="cuda")
    y = torch.empty_like(x)
    ms = timed(lambda a: y.copy_(a), [x], repeat)
    return 2 * n * 4 / (ms / 1e3) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--workload", default="W1,W2,W3,W4,W5,W5-sdpa,LG,W5-bf16,W5-bf16-sdpa")
    args = ap.parse_args()
    dev = "cuda"
    copy = copy_gbps(args.quick, args.repeat)
    results = []
    for wid in args.workload.split(","):
        xs = inputs(wid, args.quick, dev)
        if wid == "W4":
            model = W4().to(dev).eval()
            base = lambda x: model(x)
        elif wid.startswith("W5"):
            model = W5(128 if args.quick else 768, sdpa=wid.endswith("sdpa")).to(dev).eval()
            if "bf16" in wid:
                model = model.to(torch.bfloat16)
                xs = [x.to(torch.bfloat16) for x in xs]
            base = lambda x: model(x)
        else:
            base = {"W1": w1, "W2": w2, "W3": w3, "LG": lg}[wid]
        with torch.no_grad():
            for mode in ["eager", "default", "reduce-overhead"]:
                torch._dynamo.reset()
                fn = base if mode == "eager" else torch.compile(base, mode=None if mode == "default" else mode)
                t0 = time.perf_counter()
                out = fn(*xs)
                torch.cuda.synchronize()
                cold = (time.perf_counter() - t0) * 1e3
                ms = timed(fn, xs, args.repeat)
                b = bytes_moved(wid, xs, out)
                gbps = b / (ms / 1e3) / 1e9
                results.append({
                    "workload": wid, "backend": "torch-cuda", "mode": mode, "median_ms": ms,
                    "timing": "CUDA events", "max_rel_err": 0.0, "correct": True, "kernels": None,
                    "bytes": b, "gbps": gbps, "frac_copy": gbps / copy, "tflops": None,
                    "cold_compile_ms": cold if mode != "eager" else 0.0, "warm_compile_ms": None,
                })
                print(f"{wid} {mode}: {ms:.4f} ms, {gbps:.0f} GB/s ({100 * gbps / copy:.0f}% of copy), compile {cold:.0f} ms", flush=True)
                if mode == "default":
                    call = public_call(fn, xs, args.repeat)
                    results.append({**results[-1], "mode": "public call", "median_ms": call,
                                    "timing": "host wall time, call + sync", "gbps": b / (call / 1e3) / 1e9,
                                    "frac_copy": b / (call / 1e3) / 1e9 / copy})
                    print(f"{wid} default, public call + sync: {call:.4f} ms", flush=True)
    report = {
        "schema": "kiln-bench/1", "peer": "torch " + torch.__version__, "quick": args.quick,
        "devices": [torch.cuda.get_device_name()], "copy_gbps": {"torch-cuda": copy}, "results": results,
    }
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
