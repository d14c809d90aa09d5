#!/bin/bash
# Session 47, first call (two H200s): kiln's W5 GPT step alone / two ranks (f32- and bf16-averaged),
# NCCL knobs (CTA policy, protocol), batch 16; two fresh processes per configuration where it matters.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
for f in .gpu/d47.xz .gpu/kr47.xz; do xz -dkf $f; done
chmod +x .gpu/d47 .gpu/kr47
export KILN_RUN=$PWD/.gpu/kr47 XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvidia-smi topo -m | head -3
env | grep -E "^NCCL|MULTICAST|NVLS" 
J=$R/kiln.jsonl
one() { # label, then args
  local label=$1; shift
  timeout 90 "$@" --out $J > $R/$label.log 2>&1; local rc=$?
  echo "$label rc=$rc $(tail -1 $R/$label.log | python3 -c 'import sys,json
try:
  d=json.loads(sys.stdin.read()); print(d["world"], d["precision"], d["batch_per_gpu"], "%.3f"%d["step_ms_median"], ["%.2f"%w for w in d["step_ms_windows"]])
except Exception as e: print("?", e)')"
}
for t in 1 2; do
  one alone-$t .gpu/d47 --bf16
  one r2f32-$t .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16
  one r2bf16-$t .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --reduce-bf16
done
NCCL_CTA_POLICY=1 one cta1-bf16 .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --reduce-bf16
NCCL_CTA_POLICY=1 one cta1-f32 .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16
NCCL_PROTO=Simple one simple-bf16 .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --reduce-bf16
NCCL_PROTO=LL128 one ll128-bf16 .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --reduce-bf16
one alone-3 .gpu/d47 --bf16
one r2bf16-3 .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --reduce-bf16
for t in 1 2; do
  one b16-alone-$t .gpu/d47 --bf16 --batch 16
  one b16-r2f32-$t .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --batch 16
  one b16-r2bf16-$t .gpu/kr47 --gpus 2 -- .gpu/d47 --bf16 --batch 16 --reduce-bf16
done
