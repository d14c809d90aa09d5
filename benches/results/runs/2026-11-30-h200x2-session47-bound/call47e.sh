#!/bin/bash
# Session 47, fifth call (two H200s): tests/ddp.rs with the binding launcher; the two-rank step bound
# (new kiln-run) and unbound (old), interleaved, fresh processes.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
for f in .gpu/d47b.xz .gpu/kr47b.xz .gpu/kr47.xz .gpu/ddp47.xz; do xz -dkf $f; done
chmod +x .gpu/d47b .gpu/kr47b .gpu/kr47 .gpu/ddp47
export XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
KILN_RUN=$PWD/.gpu/kr47b timeout 300 .gpu/ddp47 --include-ignored --nocapture --test-threads 1 > $R/ddp.log 2>&1; echo "ddp tests rc=$?"
grep -E "^test |test result|panicked|losses|rank 0 stopped|trained in" $R/ddp.log | tail -20
J=$R/kiln.jsonl
summ='import sys,json
try:
  l=[x for x in sys.stdin.read().splitlines() if "{" in x][-1]; d=json.loads(l[l.index("{"):])
  print(d["world"], d["precision"], d["batch_per_gpu"], "%.3f"%d["step_ms_median"], ["%.2f"%w for w in d["step_ms_windows"]][:6])
except Exception as e: print("?", e)'
one() { local label=$1 limit=$2; shift 2
  timeout $limit "$@" --out $J > $R/$label.log 2>&1; local rc=$?
  echo "$label rc=$rc $(python3 -c "$summ" < $R/$label.log)"; [ $rc -eq 0 ] || tail -5 $R/$label.log; }
for t in 1 2 3 4 5 6; do
  one bound-$t 60 .gpu/kr47b --gpus 2 -- .gpu/d47b --bf16 --reduce-bf16
  [ $t -le 3 ] && one unbound-$t 60 .gpu/kr47 --gpus 2 -- .gpu/d47b --bf16 --reduce-bf16
  [ $t -le 3 ] && one bound-f32-$t 60 .gpu/kr47b --gpus 2 -- .gpu/d47b --bf16
  [ $t -le 3 ] && one alone-$t 60 .gpu/d47b --bf16
done
for t in 1 2; do
  one b16-alone-$t 60 .gpu/d47b --bf16 --batch 16
  one b16-bound-$t 60 .gpu/kr47b --gpus 2 -- .gpu/d47b --bf16 --batch 16 --reduce-bf16
  one b16-bound-f32-$t 60 .gpu/kr47b --gpus 2 -- .gpu/d47b --bf16 --batch 16
done
for t in 1 2; do
  one f32-alone-$t 90 .gpu/d47b
  one f32-bound-$t 90 .gpu/kr47b --gpus 2 -- .gpu/d47b
done
