"""torch's side of `examples/loader_overlap`: the same MLP regression (Linear layers of `width` with
GELU between, MSE loss, AdamW lr 1e-4), batches of `batch` rows of f32 features and targets from a
`DataLoader` (shuffled, `pin_memory=True`, copied with `non_blocking=True`, the pattern torch's docs give)
against the same steps on one batch kept on the GPU. Times as the kiln example does: the median over
windows of `window` steps, each window ending with a read of its last loss. Modes: eager and
torch.compile (default); `--workers` sets the DataLoader's worker processes (0: the main process).
Prints one JSON line per mode."""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--modes", default="eager,default")
    ap.add_argument(
        "--profile", action="store_true",
        help="after the resident steps, one more inside cudaProfilerStart/Stop (for `ncu --profile-from-start off`), "
        "and no loader",
    )
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # kiln's f32 GEMMs are full precision
    rows = args.batch * args.batches
    g = torch.Generator().manual_seed(1)
    x = torch.rand(rows, args.width, generator=g) * 2 - 1
    y = torch.rand(rows, args.width, generator=g) * 2 - 1
    ds = torch.utils.data.TensorDataset(x, y)

    for mode in args.modes.split(","):
        torch.manual_seed(7)
        layers = torch.nn.ModuleList([torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]).to(dev)
        opt = torch.optim.AdamW(layers.parameters(), lr=1e-4)

        def loss_of(xb, yb):
            h = xb
            for i, l in enumerate(layers):
                h = l(h)
                if i + 1 < len(layers):
                    h = F.gelu(h)
            return F.mse_loss(h, yb)

        f = loss_of if mode == "eager" else torch.compile(loss_of)

        def step(xb, yb):
            opt.zero_grad(set_to_none=True)
            loss = f(xb, yb)
            loss.backward()
            opt.step()
            return loss

        def timed(next_batch):
            for _ in range(5):
                step(*next_batch())
            step(*next_batch()).item()
            windows = []
            for _ in range((args.steps + args.window - 1) // args.window):
                t = time.perf_counter()
                for _ in range(args.window):
                    loss = step(*next_batch())
                loss.item()
                windows.append((time.perf_counter() - t) * 1e3 / args.window)
            return statistics.median(windows), windows

        resident = (x[: args.batch].to(dev), y[: args.batch].to(dev))
        resident_ms, resident_w = timed(lambda: resident)
        if args.profile:
            # The backward runs on autograd's thread: the profiler's range holds for every thread.
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            step(*resident)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            print(json.dumps({"peer": "torch", "mode": mode, "layers": args.layers, "resident_step_ms": resident_ms}))
            continue

        loader = torch.utils.data.DataLoader(
            ds, batch_size=args.batch, shuffle=True, pin_memory=True, num_workers=args.workers,
            persistent_workers=args.workers > 0,
        )
        it = iter(loader)

        def fed():
            nonlocal it
            try:
                xb, yb = next(it)
            except StopIteration:
                it = iter(loader)
                xb, yb = next(it)
            return xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)

        fed_ms, fed_w = timed(fed)
        print(json.dumps({
            "peer": "torch", "mode": mode, "workers": args.workers, "batch": args.batch, "width": args.width,
            "layers": args.layers, "resident_step_ms": resident_ms, "loader_step_ms": fed_ms,
            "resident_windows_ms": resident_w, "loader_windows_ms": fed_w, "torch": torch.__version__,
        }), flush=True)


if __name__ == "__main__":
    main()
