#!/bin/bash
# Session 48, fourth call (one H200): fit's CUDA tests one at a time (they share the device's counters).
cd "$(dirname "$0")/.."
R=$OUT/r; mkdir -p $R; trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
dpkg -i .gpu/fonts-dejavu-core_2.37-6_all.deb > $R/dpkg.log 2>&1; echo "fonts rc=$?"
for f in .gpu/fit48d.xz .gpu/ptxas.xz; do xz -dkf $f; done
chmod +x .gpu/fit48d .gpu/ptxas
export KILN_PTXAS=$PWD/.gpu/ptxas XDG_RUNTIME_DIR=$(mktemp -d) KILN_CACHE_DIR=$(mktemp -d)
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
for t in 1 2; do
timeout 200 .gpu/fit48d --include-ignored cuda_ > $R/fit-cuda-$t.log 2>&1; echo "fit (cuda) #$t rc=$?: $(grep 'test result' $R/fit-cuda-$t.log)"
grep -E "panicked|FAILED" -A3 $R/fit-cuda-$t.log | head -12
done
