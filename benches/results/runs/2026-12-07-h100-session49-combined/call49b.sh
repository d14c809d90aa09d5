#!/bin/bash
# Session 49, second call (one GPU): the combined-launch conformance case on NVIDIA Vulkan; torch's
# W5-train-bf16 (explicit attention and SDPA, reduce-overhead; its float64 outputs for kiln's check),
# then kiln's W5-train-bf16 combined vs not (KILN_CUDA_COMBINE_THREADS=0) in alternating fresh
# processes, and 2^20.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
for f in .gpu/*.xz .gpu/tests/*.xz; do xz -dkf "$f"; done
chmod +x .gpu/ptxas .gpu/kiln-bench .gpu/tests/*
for f in .gpu/gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export KILN_PTXAS=$PWD/.gpu/ptxas XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 120 .gpu/tests/conformance_wgpu --include-ignored small_kernels every_op edge_cases linear_epilogues > $R/conf-vulkan.log 2>&1; echo "conformance_wgpu (Vulkan) rc=$?: $(grep 'test result' $R/conf-vulkan.log)"
grep -E "adapter|panicked|FAILED" -A3 $R/conf-vulkan.log | head -8
E=/tmp/expect; mkdir -p $E
caches=$(mktemp -d); export TORCHINDUCTOR_CACHE_DIR=$caches/inductor TRITON_CACHE_DIR=$caches/triton
S=$SECONDS
PYTHONUNBUFFERED=1 timeout 300 python3 benches/peers/torch_compile.py --json $R/torch-1.json --outputs $E \
  --workload W5-train-bf16,W5-train-bf16-sdpa --modes reduce-overhead > $R/torch-1.log 2>&1
echo "torch rc=$? in $((SECONDS-S)) s"; grep -E "W5" $R/torch-1.log | tail -6
b() { local label=$1; shift
  timeout 60 env "$@" .gpu/kiln-bench --backend cuda --workload W5-train-bf16 --modes reduce-overhead --expect $E \
    --peer $R/torch-1.json --json $R/$label.json --md $R/$label.md > $R/$label.log 2>&1
  echo "$label rc=$? $(grep -E '^\| W5.*cuda' $R/$label.md | cut -d'|' -f4-7,11,12 | tr '\n' ' ')"; }
for t in 1 2 3; do b new-$t KILN_X=1; b old-$t KILN_CUDA_COMBINE_THREADS=0; done
b wide-1 KILN_CUDA_COMBINE_THREADS=1048576
grep -E "^\| W5" $R/new-1.md | head -4
