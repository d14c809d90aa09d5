#!/usr/bin/env python3
"""One call of a workload in torch inside an NVTX range, for a kernel profiler to time kernel by kernel.

Why: kiln's per-kernel profile says where kiln's time goes; this says where torch's goes on the same
workload, inputs and modes (`torch_compile.py` builds both), so the two can be compared kernel by kernel
under Nsight Compute:

  ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
      python3 benches/peers/torch_kernels.py W6 default

The call comes after the peer's own warm-up, so compilation and autotuning stay outside. It is marked two
ways: the CUDA profiler's start and stop around it (`--profile-from-start off`), which hold for every
thread of the process, so a train step's backward (launched from autograd's own thread) is profiled too;
and an NVTX range (`--nvtx --nvtx-include 'kiln-profile/'`), which holds for the calling thread only.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_compile as peer  # noqa: E402
import torch  # noqa: E402


def main():
    wid = sys.argv[1] if len(sys.argv) > 1 else "W6"
    mode = sys.argv[2] if len(sys.argv) > 2 else "default"
    size = sys.argv[3] if len(sys.argv) > 3 else "full"
    dev = peer.Device("cuda")
    t = peer.inputs(wid, size, "cuda")
    # As the peer measures: under no_grad (a train step enables gradients itself).
    with torch.no_grad():
        fn, args = peer.make_fn(mode, wid, t)
        peer.warm_up(dev, fn, args)
        dev.sync()
        torch.cuda.cudart().cudaProfilerStart()
        torch.cuda.nvtx.range_push("kiln-profile")
        fn(*args)
        torch.cuda.nvtx.range_pop()
        dev.sync()
        torch.cuda.cudart().cudaProfilerStop()
    print(f"{wid} {mode}: one call profiled", file=sys.stderr)


if __name__ == "__main__":
    main()
