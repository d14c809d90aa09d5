#!/bin/bash
# Session 48, second call (two H200s): this build's CUDA checks (conformance_cuda with the
# non-saturating 8-bit float casts; fit's CUDA tests with the replayed fit), fit_sonnets launched vs
# replayed, and the replayed two-rank GPT step at other bucket sizes.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
for f in .gpu/cc48b.xz .gpu/fit48.xz .gpu/fs48.xz .gpu/d48.xz .gpu/kr48.xz .gpu/ptxas.xz; do xz -dkf $f; done
chmod +x .gpu/cc48b .gpu/fit48 .gpu/fs48 .gpu/d48 .gpu/kr48 .gpu/ptxas
export KILN_PTXAS=$PWD/.gpu/ptxas KILN_RUN=$PWD/.gpu/kr48 XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 300 .gpu/cc48b --include-ignored > $R/conf-cuda.log 2>&1; echo "conformance_cuda rc=$?: $(grep 'test result' $R/conf-cuda.log)"
grep -E "panicked|FAILED" -A3 $R/conf-cuda.log | head -12
timeout 200 .gpu/fit48 --include-ignored cuda_ > $R/fit-cuda.log 2>&1; echo "fit (cuda) rc=$?: $(grep 'test result' $R/fit-cuda.log)"
grep -E "panicked|FAILED" -A3 $R/fit-cuda.log | head -12
for t in 1 2; do
  for m in default reduce-overhead; do
    flag=""; [ $m = reduce-overhead ] && flag=--reduce-overhead
    timeout 120 .gpu/fs48 --backend cuda --epochs 3 --out $R/fs-$m-$t $flag > $R/fs-$m-$t.log 2>&1; rc=$?
    echo "fit_sonnets $m #$t rc=$rc $(python3 -c "
import csv; r=list(csv.DictReader(open('$R/fs-$m-$t/epochs.csv'))); print([(x['epoch'], round(float(x['samples_per_s'])), round(float(x['val_loss']),4)) for x in r])" 2>&1 | tail -1)"
    rm -rf $R/fs-$m-$t/checkpoints
  done
done
J=$R/kiln.jsonl
summ='import sys,json
try:
  l=[x for x in sys.stdin.read().splitlines() if "{" in x][-1]; d=json.loads(l[l.index("{"):])
  print(d["world"], d["precision"], d.get("compile_mode"), d["batch_per_gpu"], "%.3f"%d["step_ms_median"], ["%.2f"%w for w in d["step_ms_windows"]][:6])
except Exception as e: print("?", e)'
one() { local label=$1 limit=$2; shift 2
  timeout $limit "$@" --out $J > $R/$label.log 2>&1; local rc=$?
  echo "$label rc=$rc $(python3 -c "$summ" < $R/$label.log)"; [ $rc -eq 0 ] || tail -5 $R/$label.log; }
for mb in 12 50 100 25; do
  KILN_CUDA_BUCKET_MB=$mb one ro-r2bf16-b$mb 60 .gpu/kr48 --gpus 2 -- .gpu/d48 --bf16 --reduce-bf16 --reduce-overhead
done
one ro-alone 60 .gpu/d48 --bf16 --reduce-overhead
