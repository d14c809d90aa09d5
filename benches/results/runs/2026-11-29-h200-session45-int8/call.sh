#!/bin/bash
# Session 45: narrow integers, integer convolutions and the int8 ONNX models on CUDA.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
for f in .gpu/conformance_cuda.s45.xz .gpu/onnx_models.s45.xz .gpu/ptxas.xz; do xz -dkf $f; done
chmod +x .gpu/conformance_cuda.s45 .gpu/onnx_models.s45 .gpu/ptxas
export KILN_PTXAS=$PWD/.gpu/ptxas
# The tests read tests/data through the path they were built at.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 .gpu/conformance_cuda.s45 --include-ignored every_op > $R/conf-cuda.log 2>&1; echo "conformance_cuda every_op: $(grep 'test result' $R/conf-cuda.log)"
grep -E "panicked|element" -A3 $R/conf-cuda.log | head -20
timeout 90 .gpu/onnx_models.s45 --include-ignored cuda > $R/onnx-cuda.log 2>&1; echo "onnx_models cuda: $(grep 'test result' $R/onnx-cuda.log)"
grep -E "panicked|element|left|right" -A3 $R/onnx-cuda.log | head -20
