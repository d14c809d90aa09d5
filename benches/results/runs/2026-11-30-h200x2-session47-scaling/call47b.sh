#!/bin/bash
# Session 47, second call (two H200s): torch DDP on the same model (benches/peers/torch_ddp_scaling.py).
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)
python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version())"
J=$R/torch.jsonl
one() { # label, limit, then command
  local label=$1 limit=$2; shift 2
  timeout $limit "$@" --out $J > $R/$label.log 2>&1; local rc=$?
  echo "$label rc=$rc $(grep '^{' $R/$label.log | tail -1 | python3 -c 'import sys,json
try:
  d=json.loads(sys.stdin.read()); print(d["world"], d["precision"], d["compile_mode"], d["attention"], d["batch_per_gpu"], "%.3f"%d["step_ms_median"], ["%.2f"%w for w in d["step_ms_windows"]], "first %.1fs"%d["first_step_s"])
except Exception as e: print("?", e)')"
  [ $rc -eq 0 ] || tail -5 $R/$label.log
}
P=benches/peers/torch_ddp_scaling.py
TR="python3 -m torch.distributed.run --standalone --nproc_per_node 2"
one eager-alone 120 python3 $P --bf16 --sdpa
one eager-r2 120 $TR $P --bf16 --sdpa
one eager-r2c 120 $TR $P --bf16 --sdpa --compress
one comp-alone 240 python3 $P --bf16 --sdpa --compile
one comp-r2 240 $TR $P --bf16 --sdpa --compile
one comp-r2c 240 $TR $P --bf16 --sdpa --compile --compress
one comp-alone-2 240 python3 $P --bf16 --sdpa --compile
one comp-r2-2 240 $TR $P --bf16 --sdpa --compile
one eager-alone-2 120 python3 $P --bf16 --sdpa
one eager-r2-2 120 $TR $P --bf16 --sdpa
