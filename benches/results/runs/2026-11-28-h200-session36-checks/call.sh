#!/usr/bin/env bash
# Session 36, call 2: which of wgpu's checks W3 slows without (granular KILN_WGPU_SHADER_CHECKS), W1
# with the grid-stride launch in one dimension, W5/W5-train per check; W3's kernel probed per check.
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
e=/tmp/kiln-expect
timeout 120 python3 benches/peers/torch_compile.py --workload W1,W2,W3,W5,W5-train --modes eager --outputs "$e" --json "$o/torch-eager.json" >"$o/torch.log" 2>&1
echo "peer rc=$?"
b() { timeout 100 .gpu/kiln-bench --expect "$e" --modes reduce-overhead "$@"; }
KILN_LOGS=output_code b --backend wgpu --workload W2,W3 --repeat 3 >"$o/wgsl.log" 2>&1
python3 .gpu/extract_wgsl.py "$o/wgsl.log" "$o/wgsl"
for c in off on loops bounds zero-init; do
  ( cd "$o/wgsl"; for f in k*layernorm*.wgsl; do KILN_WGPU_SHADER_CHECKS=$c "$OLDPWD/.gpu/wgsl_probe" 33554432 8192 "$f" "$f"; done ) >>"$o/probe.log" 2>&1
done
grep -E "checks:|median" "$o/probe.log"
for c in off on loops bounds zero-init; do
  KILN_WGPU_SHADER_CHECKS=$c b --backend wgpu --workload W1,W2,W3 --json "$o/small-$c.json" --md "$o/small-$c.md" >"$o/small-$c.log" 2>&1
done
for c in off on loops bounds; do
  KILN_WGPU_SHADER_CHECKS=$c b --backend wgpu --workload W5,W5-train --json "$o/big-$c.json" --md "$o/big-$c.md" >"$o/big-$c.log" 2>&1
done
b --backend cuda --workload W1,W2,W3 --json "$o/cuda.json" --md "$o/cuda.md" >"$o/cuda.log" 2>&1
for f in small-off small-on small-loops small-bounds small-zero-init big-off big-on big-loops big-bounds cuda; do echo "== $f"; grep -E "^\| W[0-9]" "$o/$f.md" | cut -d'|' -f2-8,12; done
timeout 120 .gpu/tests/conformance_wgpu --test-threads 4 --skip random_graphs >"$o/conf-wgpu.log" 2>&1
echo "conformance rc=$?"; grep -E "test result|FAILED|panicked" "$o/conf-wgpu.log" | head -5
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
