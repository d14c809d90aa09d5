#!/bin/bash
# Session 49, first call (one GPU): combined launches on CUDA and NVIDIA Vulkan — conformance_cuda,
# device-runtime, fit and device-fault tests; the conformance case on Vulkan; W5-train-bf16 combined vs
# not (KILN_CUDA_COMBINE_THREADS=0) in alternating fresh processes, 2^20, and W5-train f32 each way.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
mkdir -p /usr/share/fonts/truetype/dejavu && cp .gpu/DejaVuSans.ttf /usr/share/fonts/truetype/dejavu/
for f in .gpu/*.xz .gpu/tests/*.xz; do xz -dkf "$f"; done
chmod +x .gpu/ptxas .gpu/kiln-bench .gpu/fit_sonnets .gpu/tests/*
for f in .gpu/gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export KILN_PTXAS=$PWD/.gpu/ptxas XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
T=.gpu/tests
timeout 240 $T/conformance_cuda --include-ignored > $R/conf-cuda.log 2>&1; echo "conformance_cuda rc=$?: $(grep 'test result' $R/conf-cuda.log)"
grep -E "panicked|FAILED" -A3 $R/conf-cuda.log | head -12
timeout 100 $T/device_runtime --include-ignored on_cuda > $R/device-runtime.log 2>&1; echo "device_runtime on_cuda rc=$?: $(grep 'test result' $R/device-runtime.log)"
grep -E "panicked" -A3 $R/device-runtime.log | head -6
timeout 150 $T/fit --include-ignored cuda_ > $R/fit-cuda.log 2>&1; echo "fit (cuda) rc=$?: $(grep 'test result' $R/fit-cuda.log)"
grep -E "panicked|FAILED" -A3 $R/fit-cuda.log | head -8
timeout 60 $T/device_faults --include-ignored cuda > $R/faults.log 2>&1; echo "device_faults (cuda) rc=$?: $(grep 'test result' $R/faults.log)"
timeout 120 $T/conformance_wgpu --include-ignored small_kernels every_op edge_cases linear_epilogues > $R/conf-vulkan.log 2>&1; echo "conformance_wgpu (Vulkan) rc=$?: $(grep 'test result' $R/conf-vulkan.log)"
grep -E "adapter|panicked|FAILED" -A3 $R/conf-vulkan.log | head -8
b() { local label=$1; shift
  timeout 90 env "$@" .gpu/kiln-bench --backend cuda --workload $W --modes reduce-overhead --json $R/$label.json --md $R/$label.md > $R/$label.log 2>&1
  echo "$label rc=$? $(grep -E '^\| W5' $R/$label.md | cut -d'|' -f4-7,11,12 | tr '\n' ' ')"; }
W=W5-train-bf16
for t in 1 2 3; do b new-$t KILN_X=1; b old-$t KILN_CUDA_COMBINE_THREADS=0; done
for t in 1 2; do b wide-$t KILN_CUDA_COMBINE_THREADS=1048576; done
W=W5-train
b new-f32 KILN_X=1; b old-f32 KILN_CUDA_COMBINE_THREADS=0
