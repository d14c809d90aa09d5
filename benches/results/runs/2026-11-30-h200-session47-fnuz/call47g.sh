#!/bin/bash
# Session 47, seventh call (one H200): conformance_cuda on this build (the FNUZ 8-bit floats in the ops
# suite: casts, a zero's sign through its reciprocal), every test including the ignored ones.
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
for f in .gpu/conformance_cuda.s47.xz .gpu/ptxas.xz; do xz -dkf $f; done
chmod +x .gpu/conformance_cuda.s47 .gpu/ptxas
export KILN_PTXAS=$PWD/.gpu/ptxas XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 400 .gpu/conformance_cuda.s47 --include-ignored > $R/conf-cuda.log 2>&1; echo "conformance_cuda rc=$?: $(grep 'test result' $R/conf-cuda.log)"
grep -E "panicked|FAILED|random (graphs|gradients)" -A3 $R/conf-cuda.log | head -20
