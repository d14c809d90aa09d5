#!/bin/bash
# Session 45, second call: 8-bit floats (and narrow integers again) through PTX on CUDA.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
for f in .gpu/conformance_cuda.s45b.xz .gpu/ptxas.xz; do xz -dkf $f; done
chmod +x .gpu/conformance_cuda.s45b .gpu/ptxas
export KILN_PTXAS=$PWD/.gpu/ptxas
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
timeout 150 .gpu/conformance_cuda.s45b --include-ignored every_op edge > $R/conf-cuda-f8.log 2>&1; echo "conformance_cuda every_op edge: $(grep 'test result' $R/conf-cuda-f8.log)"
grep -E "panicked|element" -A3 $R/conf-cuda-f8.log | head -20
