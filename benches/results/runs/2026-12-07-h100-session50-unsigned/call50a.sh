#!/bin/bash
# Session 50, first call (one GPU): u32/u64 kernels on CUDA and NVIDIA Vulkan — conformance_cuda whole,
# device-runtime, fit and fault tests; every op on Vulkan; then torch's W5-train-bf16 (explicit and SDPA,
# default and reduce-overhead, one fresh process; its float64 outputs for kiln's check) and kiln's
# W5-train-bf16 reduce-overhead in three fresh processes; a second torch process (reduce-overhead).
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
mkdir -p /usr/share/fonts/truetype/dejavu && cp .gpu/DejaVuSans.ttf /usr/share/fonts/truetype/dejavu/
for f in .gpu/*.xz .gpu/tests/*.xz; do xz -dkf "$f"; done
chmod +x .gpu/ptxas .gpu/kiln-bench .gpu/tests/*
for f in .gpu/gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export KILN_PTXAS=$PWD/.gpu/ptxas XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
T=.gpu/tests
timeout 240 $T/conformance_cuda --include-ignored > $R/conf-cuda.log 2>&1; echo "conformance_cuda rc=$?: $(grep 'test result' $R/conf-cuda.log)"
grep -E "panicked|FAILED" -A3 $R/conf-cuda.log | head -12
timeout 100 $T/device_runtime --include-ignored on_cuda > $R/device-runtime.log 2>&1; echo "device_runtime on_cuda rc=$?: $(grep 'test result' $R/device-runtime.log)"
timeout 150 $T/fit --include-ignored cuda_ > $R/fit-cuda.log 2>&1; echo "fit (cuda) rc=$?: $(grep 'test result' $R/fit-cuda.log)"
timeout 60 $T/device_faults --include-ignored cuda > $R/faults.log 2>&1; echo "device_faults (cuda) rc=$?: $(grep 'test result' $R/faults.log)"
timeout 120 $T/conformance_wgpu --include-ignored every_op edge_cases small_kernels > $R/conf-vulkan.log 2>&1; echo "conformance_wgpu (Vulkan) rc=$?: $(grep 'test result' $R/conf-vulkan.log)"
grep -E "adapter|panicked|FAILED" -A3 $R/conf-vulkan.log | head -8
E=/tmp/expect; mkdir -p $E
caches=$(mktemp -d); export TORCHINDUCTOR_CACHE_DIR=$caches/inductor TRITON_CACHE_DIR=$caches/triton
S=$SECONDS
PYTHONUNBUFFERED=1 timeout 200 python3 benches/peers/torch_compile.py --json $R/torch-1.json --outputs $E \
  --workload W5-train-bf16,W5-train-bf16-sdpa --modes default,reduce-overhead > $R/torch-1.log 2>&1
echo "torch-1 rc=$? in $((SECONDS-S)) s"; grep -E "W5" $R/torch-1.log | tail -8
b() { local label=$1; shift
  timeout 60 env "$@" .gpu/kiln-bench --backend cuda --workload W5-train-bf16 --modes reduce-overhead --expect $E \
    --peer $R/torch-1.json --json $R/$label.json --md $R/$label.md > $R/$label.log 2>&1
  echo "$label rc=$? $(grep -E '^\| W5.*cuda' $R/$label.md | cut -d'|' -f4-7,11,12 | tr '\n' ' ')"; }
for t in 1 2 3; do b kiln-$t KILN_X=1; done
grep -E "^\| W5" $R/kiln-1.md | head -4
caches=$(mktemp -d); export TORCHINDUCTOR_CACHE_DIR=$caches/inductor TRITON_CACHE_DIR=$caches/triton
S=$SECONDS
PYTHONUNBUFFERED=1 timeout 150 python3 benches/peers/torch_compile.py --json $R/torch-2.json \
  --workload W5-train-bf16,W5-train-bf16-sdpa --modes reduce-overhead > $R/torch-2.log 2>&1
echo "torch-2 rc=$? in $((SECONDS-S)) s"; grep -E "W5" $R/torch-2.log | tail -4
