#!/bin/bash
# Session 48, third call (two H200s): the final build's recordings (the least-copying recording
# replays; state paired across batch sizes) on CUDA: device-runtime, fit and DDP tests (the font the
# loss plot needs installed first); fit_sonnets in small batches (many steps an epoch) launched vs
# replayed; the replayed GPT step alone and on two ranks once more.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
dpkg -i .gpu/fonts-dejavu-core_2.37-6_all.deb > $R/dpkg.log 2>&1; echo "fonts rc=$?"
for f in .gpu/dr48c.xz .gpu/fit48c.xz .gpu/fs48c.xz .gpu/ddp48c.xz .gpu/d48c.xz .gpu/kr48c.xz .gpu/ptxas.xz; do xz -dkf $f; done
chmod +x .gpu/dr48c .gpu/fit48c .gpu/fs48c .gpu/ddp48c .gpu/d48c .gpu/kr48c .gpu/ptxas
export KILN_PTXAS=$PWD/.gpu/ptxas KILN_RUN=$PWD/.gpu/kr48c XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
timeout 120 .gpu/dr48c --include-ignored on_cuda --nocapture > $R/device-runtime.log 2>&1; echo "device_runtime on_cuda rc=$?: $(grep 'test result' $R/device-runtime.log)"
grep -E "per step|panicked" -A2 $R/device-runtime.log | head -6
timeout 200 .gpu/fit48c --include-ignored cuda_ > $R/fit-cuda.log 2>&1; echo "fit (cuda) rc=$?: $(grep 'test result' $R/fit-cuda.log)"
grep -E "panicked|FAILED" -A3 $R/fit-cuda.log | head -12
timeout 300 .gpu/ddp48c --include-ignored > $R/ddp.log 2>&1; echo "ddp rc=$?: $(grep 'test result' $R/ddp.log)"
grep -E "panicked|FAILED" -A3 $R/ddp.log | head -12
for t in 1 2; do
  for m in default reduce-overhead; do
    flag=""; [ $m = reduce-overhead ] && flag=--reduce-overhead
    timeout 150 .gpu/fs48c --backend cuda --batch 4 --epochs 12 --out $R/fs-$m-$t $flag > $R/fs-$m-$t.log 2>&1; rc=$?
    echo "fit_sonnets b4 $m #$t rc=$rc $(python3 -c "
import csv; r=list(csv.DictReader(open('$R/fs-$m-$t/epochs.csv'))); print([round(float(x['samples_per_s'])) for x in r], 'val', [round(float(x['val_loss']),4) for x in r][-3:])" 2>&1 | tail -1)"
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
one ro-alone 60 .gpu/d48c --bf16 --reduce-overhead
for t in 1 2; do one ro-r2bf16-$t 60 .gpu/kr48c --gpus 2 -- .gpu/d48c --bf16 --reduce-bf16 --reduce-overhead; done
