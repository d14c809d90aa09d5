#!/bin/bash
# Session 47, fourth call (two H200s): the two-rank bf16 step's two modes (3.07 vs 3.37 ms) — host or
# device? Replayed (reduce-overhead) vs launched; launched with each rank pinned to its own cores.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
for f in .gpu/d47.xz .gpu/kr47.xz; do xz -dkf $f; done
chmod +x .gpu/d47 .gpu/kr47
export KILN_RUN=$PWD/.gpu/kr47 XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|Model name)"; lscpu -e=CPU,CORE,NODE | head -40 | tr '\n' ';'; echo
J=$R/kiln.jsonl
summ='import sys,json
try:
  l=[x for x in sys.stdin.read().splitlines() if "{" in x][-1]; d=json.loads(l[l.index("{"):])
  print(d["world"], d["precision"], d.get("compile_mode"), d["batch_per_gpu"], "%.3f"%d["step_ms_median"], ["%.2f"%w for w in d["step_ms_windows"]][:6])
except Exception as e: print("?", e)'
one() { local label=$1 limit=$2; shift 2
  timeout $limit "$@" --out $J > $R/$label.log 2>&1; local rc=$?
  echo "$label rc=$rc $(python3 -c "$summ" < $R/$label.log)"; [ $rc -eq 0 ] || tail -5 $R/$label.log; }
# Rank r on cores [r*8, r*8+8) (two ranks on different physical cores whatever the numbering, given
# the topology printed above), or both on one core pair (the same two logical CPUs).
cat > .gpu/pin.sh <<'P'
#!/bin/bash
case "$PIN" in
  apart) exec taskset -c $((LOCAL_RANK*8))-$((LOCAL_RANK*8+7)) "$@" ;;
  same) exec taskset -c 0,1 "$@" ;;
  *) exec "$@" ;;
esac
P
chmod +x .gpu/pin.sh
for t in 1 2 3 4; do
  one ro-r2-$t 60 .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --reduce-bf16 --reduce-overhead
  PIN=apart one apart-$t 60 .gpu/kr47 --gpus 2 -- .gpu/pin.sh .gpu/d47 --bf16 --reduce-bf16
  one free-$t 60 .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --reduce-bf16
done
for t in 1 2; do
  one ro-alone-$t 60 .gpu/d47 --bf16 --reduce-overhead
  PIN=same one same-$t 60 .gpu/kr47 --gpus 2 -- .gpu/pin.sh .gpu/d47 --bf16 --reduce-bf16
  one alone-$t 60 .gpu/d47 --bf16
  one ro-r2f32-$t 60 .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --reduce-overhead
done
