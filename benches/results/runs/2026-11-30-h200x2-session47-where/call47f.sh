#!/bin/bash
# Session 47, sixth call (two H200s): is the two-rank step's slow mode where its ranks run? Ranks pinned
# to 0-7 / 8-15 (the fourth call's "apart", 4 of 4 fast) against 16-23 / 24-31, interleaved, and the
# launcher with no binding.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
for f in .gpu/d47b.xz .gpu/kr47b.xz; do xz -dkf $f; done
chmod +x .gpu/d47b .gpu/kr47b
export XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
cat > .gpu/pin.sh <<'P'
#!/bin/bash
exec taskset -c $((BASE + LOCAL_RANK*8))-$((BASE + LOCAL_RANK*8+7)) "$@"
P
chmod +x .gpu/pin.sh
J=$R/kiln.jsonl
summ='import sys,json
try:
  l=[x for x in sys.stdin.read().splitlines() if "{" in x][-1]; d=json.loads(l[l.index("{"):])
  print(d["world"], d["precision"], d["batch_per_gpu"], "%.3f"%d["step_ms_median"], ["%.2f"%w for w in d["step_ms_windows"]][:6])
except Exception as e: print("?", e)'
one() { local label=$1 limit=$2; shift 2
  timeout $limit "$@" --out $J > $R/$label.log 2>&1; local rc=$?
  echo "$label rc=$rc $(python3 -c "$summ" < $R/$label.log)"; [ $rc -eq 0 ] || tail -5 $R/$label.log; }
for t in 1 2 3 4 5; do
  BASE=0 one low-$t 60 .gpu/kr47b --cpu-bind none --gpus 2 -- .gpu/pin.sh .gpu/d47b --bf16 --reduce-bf16
  BASE=16 one high-$t 60 .gpu/kr47b --cpu-bind none --gpus 2 -- .gpu/pin.sh .gpu/d47b --bf16 --reduce-bf16
  [ $t -le 3 ] && one none-$t 60 .gpu/kr47b --cpu-bind none --gpus 2 -- .gpu/d47b --bf16 --reduce-bf16
done
