#!/bin/bash
# Session 48, fifth call (two H200s): the final build on CUDA — conformance_cuda (a recording keeps its
# GEMM plans through a cache trim), device-runtime, fit and DDP tests; the replayed GPT step alone and
# on two ranks.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
dpkg -i .gpu/fonts-dejavu-core_2.37-6_all.deb > $R/dpkg.log 2>&1; echo "fonts rc=$?"
for f in conformance_cuda device_runtime fit ddp d kr; do xz -dkf .gpu/$f.e.xz; chmod +x .gpu/$f.e; done
xz -dkf .gpu/ptxas.xz; chmod +x .gpu/ptxas
export KILN_PTXAS=$PWD/.gpu/ptxas KILN_RUN=$PWD/.gpu/kr.e XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 300 .gpu/conformance_cuda.e --include-ignored > $R/conf-cuda.log 2>&1; echo "conformance_cuda rc=$?: $(grep 'test result' $R/conf-cuda.log)"
grep -E "panicked|FAILED" -A3 $R/conf-cuda.log | head -12
timeout 120 .gpu/device_runtime.e --include-ignored on_cuda --nocapture > $R/device-runtime.log 2>&1; echo "device_runtime on_cuda rc=$?: $(grep 'test result' $R/device-runtime.log)"
grep -E "panicked" -A3 $R/device-runtime.log | head -6
timeout 200 .gpu/fit.e --include-ignored cuda_ > $R/fit-cuda.log 2>&1; echo "fit (cuda) rc=$?: $(grep 'test result' $R/fit-cuda.log)"
grep -E "panicked|FAILED" -A3 $R/fit-cuda.log | head -8
timeout 300 .gpu/ddp.e --include-ignored > $R/ddp.log 2>&1; echo "ddp rc=$?: $(grep 'test result' $R/ddp.log)"
grep -E "panicked|FAILED" -A3 $R/ddp.log | head -8
J=$R/kiln.jsonl
summ='import sys,json
try:
  l=[x for x in sys.stdin.read().splitlines() if "{" in x][-1]; d=json.loads(l[l.index("{"):])
  print(d["world"], d["precision"], d.get("compile_mode"), d["batch_per_gpu"], "%.3f"%d["step_ms_median"], ["%.2f"%w for w in d["step_ms_windows"]][:6])
except Exception as e: print("?", e)'
one() { local label=$1 limit=$2; shift 2
  timeout $limit "$@" --out $J > $R/$label.log 2>&1; local rc=$?
  echo "$label rc=$rc $(python3 -c "$summ" < $R/$label.log)"; [ $rc -eq 0 ] || tail -5 $R/$label.log; }
one ro-alone 60 .gpu/d.e --bf16 --reduce-overhead
one alone 60 .gpu/d.e --bf16
for t in 1 2; do one ro-r2bf16-$t 60 .gpu/kr.e --gpus 2 -- .gpu/d.e --bf16 --reduce-bf16 --reduce-overhead; done
