#!/bin/bash
# Session 48, first call (two H200s): reduce-overhead recordings that take a step's state in place
# (two recordings feeding each other). Correctness on CUDA first (the device-runtime suite, the
# recorded-graph conformance tests, the two-rank DDP tests including the recorded step), then the
# trainer's step launched vs replayed, alone and on two ranks, fresh processes.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
for f in .gpu/cc48.xz .gpu/dr48.xz .gpu/ddp48.xz .gpu/d48.xz .gpu/kr48.xz .gpu/ptxas.xz; do xz -dkf $f; done
chmod +x .gpu/cc48 .gpu/dr48 .gpu/ddp48 .gpu/d48 .gpu/kr48 .gpu/ptxas
export KILN_PTXAS=$PWD/.gpu/ptxas KILN_RUN=$PWD/.gpu/kr48 XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 .gpu/dr48 --include-ignored --nocapture > $R/device-runtime.log 2>&1; echo "device_runtime rc=$?: $(grep 'test result' $R/device-runtime.log)"
grep -E "per step|panicked" -A2 $R/device-runtime.log | head -12
timeout 200 .gpu/cc48 --include-ignored recorded reduce_overhead > $R/conf-cuda-recorded.log 2>&1; echo "conformance_cuda (recorded) rc=$?: $(grep 'test result' $R/conf-cuda-recorded.log)"
timeout 300 .gpu/ddp48 --include-ignored > $R/ddp.log 2>&1; echo "ddp rc=$?: $(grep 'test result' $R/ddp.log)"
grep -E "panicked|FAILED" -A3 $R/ddp.log | head -12
J=$R/kiln.jsonl
summ='import sys,json
try:
  l=[x for x in sys.stdin.read().splitlines() if "{" in x][-1]; d=json.loads(l[l.index("{"):])
  print(d["world"], d["precision"], d.get("compile_mode"), d["batch_per_gpu"], "%.3f"%d["step_ms_median"], ["%.2f"%w for w in d["step_ms_windows"]][:6], "peak", d.get("peak_bytes", d.get("memory_peak")))
except Exception as e: print("?", e)'
one() { local label=$1 limit=$2; shift 2
  timeout $limit "$@" --out $J > $R/$label.log 2>&1; local rc=$?
  echo "$label rc=$rc $(python3 -c "$summ" < $R/$label.log)"; [ $rc -eq 0 ] || tail -5 $R/$label.log; }
for t in 1 2; do
  one alone-$t 60 .gpu/d48 --bf16
  one ro-alone-$t 60 .gpu/d48 --bf16 --reduce-overhead
done
for t in 1 2 3; do
  one r2bf16-$t 60 .gpu/kr48 --gpus 2 -- .gpu/d48 --bf16 --reduce-bf16
  one ro-r2bf16-$t 60 .gpu/kr48 --gpus 2 -- .gpu/d48 --bf16 --reduce-bf16 --reduce-overhead
done
