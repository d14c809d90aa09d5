#!/bin/bash
# Session 47, third call (two H200s): kiln's two-rank bf16-averaged step, six fresh processes with NCCL's
# INIT log (the fast/slow modes of the first call), LL128 and Simple three each; torch fixed (device_id,
# longer warm-up).
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
for f in .gpu/d47.xz .gpu/kr47.xz; do xz -dkf $f; done
chmod +x .gpu/d47 .gpu/kr47
export KILN_RUN=$PWD/.gpu/kr47 XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)
J=$R/kiln.jsonl
summ='import sys,json
try:
  l=[x for x in sys.stdin.read().splitlines() if "{" in x][-1]; d=json.loads(l[l.index("{"):])
  print(d["world"], d["precision"], d.get("compile_mode"), d["batch_per_gpu"], "%.3f"%d["step_ms_median"], ["%.2f"%w for w in d["step_ms_windows"]][:6], d.get("devices",""))
except Exception as e: print("?", e)'
one() { # label, limit, then command
  local label=$1 limit=$2; shift 2
  timeout $limit "$@" --out $J > $R/$label.log 2>&1; local rc=$?
  echo "$label rc=$rc $(python3 -c "$summ" < $R/$label.log)"
  [ $rc -eq 0 ] || tail -5 $R/$label.log
}
for t in 1 2 3 4 5 6; do
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING one def-$t 60 .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --reduce-bf16
  grep -hE "channels|Channel 0|NCCL_ALGO|NCCL_PROTO|Enabled NCCL|CC/|comm 0x|nRanks" $R/def-$t.log | sed 's/^/    /' | sort | uniq -c | sort -rn | head -8
done
for t in 1 2 3; do
  NCCL_PROTO=LL128 one ll128-$t 60 .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --reduce-bf16
  NCCL_PROTO=Simple one simple-$t 60 .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --reduce-bf16
  NCCL_PROTO=LL128 one ll128f32-$t 60 .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16
done
one alone-1 60 .gpu/d47 --bf16
one alone-2 60 .gpu/d47 --bf16
P=benches/peers/torch_ddp_scaling.py
TR="python3 -m torch.distributed.run --standalone --nproc_per_node 2"
one t-eager-alone 120 python3 $P --bf16 --sdpa
one t-eager-r2 120 $TR $P --bf16 --sdpa
one t-comp-alone 240 python3 $P --bf16 --sdpa --compile
one t-comp-r2 240 $TR $P --bf16 --sdpa --compile
one t-comp-r2c 240 $TR $P --bf16 --sdpa --compile --compress
one t-comp-alone-2 240 python3 $P --bf16 --sdpa --compile
one t-comp-r2-2 240 $TR $P --bf16 --sdpa --compile
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,power.draw --format=csv
