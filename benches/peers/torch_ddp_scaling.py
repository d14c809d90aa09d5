#!/usr/bin/env python3
"""Torch's data-parallel scaling of the model `examples/ddp_scaling.rs` times, measured the same way.

Why it exists: issue 18 asks kiln's W5 training step to scale ≥ 1.9× from one GPU to two. Whether that
bar is met says more beside what torch's own DistributedDataParallel gets for the same model, batch and
GPUs. This is kiln's `Gpt` (`torch_train_parity.Gpt`: 4 pre-LN blocks, width 768, 12 heads, sequences
of 512, vocabulary 256, a bias-free head, cross-entropy) trained with AdamW at a fixed batch per GPU,
timed as `ddp_scaling` times kiln: untimed warm-up steps (compilation included), then windows of steps
that each end with a read of the last loss; the median window's step time is reported.

Run alone (`python3 torch_ddp_scaling.py --bf16`) for one GPU without DDP, or under
`torchrun --nproc_per_node 2 torch_ddp_scaling.py --bf16` for DDP over NCCL (each rank its own batch).
`--bf16` is torch's bf16-mixed (autocast over f32 parameters; DDP averages f32 gradients, as kiln's
default); `--compress` averages them in bf16 (`bf16_compress_hook`, as kiln's `reduce_in_model_dtype`);
`--compile` wraps the DDP module in `torch.compile` (DDP's optimizer splits the graph at its buckets);
`--sdpa` uses `F.scaled_dot_product_attention` (flash attention) in place of the explicit softmax.
Prints one JSON line (rank 0), appended to `--out` too.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train_parity import Block, Gpt  # noqa: E402


def sdpa_forward(self, x):
    """`Block.forward` with flash attention (`is_causal`) for the explicit masked softmax."""
    b, s, d = x.shape
    hd = d // self.heads
    qkv = self.attn.qkv(self.ln1(x))
    q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(b, s, self.heads, hd).permute(0, 2, 1, 3) for i in range(3))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + self.attn.proj(a.permute(0, 2, 1, 3).reshape(b, s, d))
    return x + self.mlp.proj(F.gelu(self.mlp.fc(self.ln2(x))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8, help="sequences per GPU in a step")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast over f32 parameters")
    ap.add_argument("--compress", action="store_true", help="as a rank: average gradients in bf16")
    ap.add_argument("--compile", action="store_true", help="torch.compile the (DDP) module")
    ap.add_argument("--sdpa", action="store_true", help="flash attention instead of the explicit softmax")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    distributed = "WORLD_SIZE" in os.environ
    rank, world = 0, 1
    if distributed:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        # The rank's own GPU first, and named to the process group (or NCCL's communicator may be
        # made on the first GPU by every rank).
        local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=local)
        rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda")
    if a.sdpa:
        Block.forward = sdpa_forward
    torch.manual_seed(1)
    model = Gpt(256, a.context, a.dim, a.heads, a.layers).to(device)
    if distributed:
        model = DDP(model, device_ids=[torch.cuda.current_device()], gradient_as_bucket_view=True)
        if a.compress:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    inner = model.module if distributed else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    forward = torch.compile(model) if a.compile else model
    # Each rank's own tokens (a different batch per rank, as a sharded loader gives).
    gen = torch.Generator().manual_seed(0x9E3779B9 * (rank + 1) % (1 << 62))
    tokens = torch.randint(0, 256, (a.batch * a.context + 1,), generator=gen)
    ids = tokens[:-1].reshape(a.batch, a.context).to(device)
    targets = tokens[1:].reshape(a.batch, a.context).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.bf16):
            logits = forward(ids)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss.detach()

    start = time.perf_counter()
    first = step().item()
    first_step_s = time.perf_counter() - start
    for _ in range(1, a.warmup):
        step()
    step().item()
    if distributed:
        dist.barrier()
    windows = []
    last = math.nan
    for _ in range(-(-a.steps // a.window)):
        t = time.perf_counter()
        for _ in range(a.window):
            loss = step()
        last = loss.item()
        windows.append((time.perf_counter() - t) * 1e3 / a.window)
    median = sorted(windows)[len(windows) // 2]
    # Which GPU each rank stepped on (two ranks on one GPU would halve the scaling silently).
    devices = [torch.cuda.current_device()]
    if distributed:
        gathered = [None] * world
        dist.all_gather_object(gathered, devices[0])
        devices = gathered
    line = {
        "peer": "torch",
        "torch": torch.__version__,
        "world": world,
        "mode": "ddp" if distributed else "single",
        "precision": ("bf16-mixed" + (", averaged in bf16" if a.compress and distributed else "")) if a.bf16 else "f32",
        "compile_mode": "default" if a.compile else "eager",
        "attention": "sdpa" if a.sdpa else "explicit",
        "batch_per_gpu": a.batch,
        "context": a.context,
        "step_ms_median": median,
        "step_ms_windows": windows,
        "step_ms_spread": statistics.pstdev(windows),
        "samples_per_s": world * a.batch / (median / 1e3),
        "tokens_per_s": world * a.batch * a.context / (median / 1e3),
        "first_step_s": first_step_s,
        "loss_first": first,
        "loss_last": last,
        "device": torch.cuda.get_device_name(),
        "devices": devices,
        "parameters": sum(p.numel() for p in inner.parameters()),
    }
    if rank == 0:
        print(json.dumps(line))
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(line) + "\n")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
