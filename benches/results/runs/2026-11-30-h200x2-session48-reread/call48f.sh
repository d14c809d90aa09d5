#!/bin/bash
# Session 48, sixth call (two H200s): the final build on CUDA — conformance_cuda (a recording keeps its
# GEMM plans through a cache trim), device-runtime, fit and DDP tests; the replayed GPT step alone and
# on two ranks.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
dpkg -i .gpu/fonts-dejavu-core_2.37-6_all.deb > $R/dpkg.log 2>&1; echo "fonts rc=$?"
for f in conformance_cuda device_runtime fit ddp kr; do xz -dkf .gpu/$f.e.xz; chmod +x .gpu/$f.e; done
xz -dkf .gpu/ptxas.xz; chmod +x .gpu/ptxas
export KILN_PTXAS=$PWD/.gpu/ptxas KILN_RUN=$PWD/.gpu/kr.e XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 300 .gpu/conformance_cuda.e --include-ignored > $R/conf-cuda.log 2>&1; echo "conformance_cuda rc=$?: $(grep 'test result' $R/conf-cuda.log)"
grep -E "panicked|FAILED" -A3 $R/conf-cuda.log | head -12
timeout 120 .gpu/device_runtime.e --include-ignored on_cuda --nocapture > $R/device-runtime.log 2>&1; echo "device_runtime on_cuda rc=$?: $(grep 'test result' $R/device-runtime.log)"
grep -E "panicked" -A3 $R/device-runtime.log | head -6
timeout 200 .gpu/fit.e --include-ignored cuda_ > $R/fit-cuda.log 2>&1; echo "fit (cuda) rc=$?: $(grep 'test result' $R/fit-cuda.log)"
grep -E "panicked|FAILED" -A3 $R/fit-cuda.log | head -8
timeout 300 .gpu/ddp.e --include-ignored > $R/ddp.log 2>&1; echo "ddp rc=$?: $(grep 'test result' $R/ddp.log)"
grep -E "panicked|FAILED" -A3 $R/ddp.log | head -8
