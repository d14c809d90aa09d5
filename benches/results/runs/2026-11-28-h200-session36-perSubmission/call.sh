#!/usr/bin/env bash
# Session 36, call 3: W3's bimodal time (process to process? which workloads ran before?), W2's row
# kernel variants (reciprocal, vec4 rows) probed, row threads 512/1024 for W2/W3.
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
e=/tmp/kiln-expect
P="$PWD/.gpu/wgsl_probe"
( cd .gpu/probe2; $P 67108864 8192 sm_generated.wgsl sm_recip.wgsl sm_vec4.wgsl sm_generated.wgsl ) >"$o/probe.log" 2>&1
for i in 1 2; do for c in off on; do
  ( cd .gpu/probe2; KILN_WGPU_SHADER_CHECKS=$c $P 33554432 8192 w3_generated.wgsl w3_generated.wgsl ) >>"$o/probe.log" 2>&1
done; done
grep -E "checks|median" "$o/probe.log"
timeout 120 python3 benches/peers/torch_compile.py --workload W1,W2,W3 --modes eager --outputs "$e" --json "$o/torch-eager.json" >"$o/torch.log" 2>&1
echo "peer rc=$?"
b() { timeout 60 .gpu/kiln-bench --expect "$e" --modes reduce-overhead "$@"; }
row() { grep -E "^\| W[0-9]" "$1" | cut -d'|' -f2,5,6 | tr '\n' ' '; echo; }
for i in 1 2 3 4; do b --backend wgpu --workload W3 --md "$o/w3-$i.md" >"$o/w3-$i.log" 2>&1; echo "W3 alone $i: $(row $o/w3-$i.md)"; done
for i in 1 2; do
  b --backend wgpu --workload W1,W2,W3 --md "$o/all-$i.md" >"$o/all-$i.log" 2>&1; echo "W1-W3 off $i: $(row $o/all-$i.md)"
  KILN_WGPU_SHADER_CHECKS=on b --backend wgpu --workload W1,W2,W3 --md "$o/on-$i.md" >"$o/on-$i.log" 2>&1; echo "W1-W3 on $i: $(row $o/on-$i.md)"
done
b --backend wgpu --workload W3,W1 --md "$o/w3w1.md" >"$o/w3w1.log" 2>&1; echo "W3,W1: $(row $o/w3w1.md)"
for t in 512 1024; do
  KILN_WGPU_ROW_THREADS=$t b --backend wgpu --workload W2,W3 --md "$o/rt-$t.md" >"$o/rt-$t.log" 2>&1; echo "row threads $t: $(row $o/rt-$t.md)"
done
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
