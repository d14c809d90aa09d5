#!/usr/bin/env bash
# Session 36, call 1: kiln's shaders compiled trusted (no naga index clamps, loop counters or workgroup
# zeroing) vs wgpu's checks (KILN_WGPU_SHADER_CHECKS=on), alternating, two processes each, on wgpu;
# kiln CUDA in the same call; W1's WGSL variants through wgsl_probe; conformance_wgpu trusted.
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
e=/tmp/kiln-expect
p=.gpu/probe
( cd $p; ../wgsl_probe 67108864 65536 w1_generated.wgsl w1_exp2.wgsl w1_nonan.wgsl w1_only_erf.wgsl w1_only_sigmoid.wgsl w1_only_tanh.wgsl w1_copy.wgsl w1_generated.wgsl ) >"$o/probe.log" 2>&1
( cd $p; ../wgsl_probe 67108864 32768 w1_generated.wgsl w1_two_vectors.wgsl; ../wgsl_probe 67108864 2112 w1_generated.wgsl w1_persistent.wgsl; KILN_WGPU_SHADER_CHECKS=on ../wgsl_probe 67108864 65536 w1_generated.wgsl w1_copy.wgsl ) >>"$o/probe.log" 2>&1
cat "$o/probe.log"
timeout 120 python3 benches/peers/torch_compile.py --workload W1,W2,W3,W5,W5-train --modes eager --outputs "$e" --json "$o/torch-eager.json" >"$o/torch.log" 2>&1
echo "peer rc=$?"
b() { timeout 100 .gpu/kiln-bench --expect "$e" --modes reduce-overhead "$@"; }
for i in 1 2; do
  KILN_WGPU_SHADER_CHECKS=on b --backend wgpu --workload W1,W2,W3,W5,W5-train --json "$o/checked-$i.json" --md "$o/checked-$i.md" >"$o/checked-$i.log" 2>&1
  echo "checked-$i rc=$?"
  b --backend wgpu --workload W1,W2,W3,W5,W5-train --json "$o/trusted-$i.json" --md "$o/trusted-$i.md" >"$o/trusted-$i.log" 2>&1
  echo "trusted-$i rc=$?"
done
b --backend cuda --workload W1,W2,W3,W5 --json "$o/cuda.json" --md "$o/cuda.md" >"$o/cuda.log" 2>&1
b --backend wgpu --workload W5 --profile --md "$o/profile-w5-trusted.md" >"$o/profile.log" 2>&1
for f in checked-1 trusted-1 checked-2 trusted-2 cuda; do echo "== $f"; grep -E "^\| W[0-9]" "$o/$f.md" | cut -d'|' -f2-8,12; done
grep -iE "attention|linear" "$o/profile-w5-trusted.md" | head -8
timeout 200 .gpu/tests/conformance_wgpu --test-threads 4 --skip random_graphs >"$o/conf-wgpu.log" 2>&1
echo "conformance rc=$?"; grep -E "test result|FAILED|panicked" "$o/conf-wgpu.log" | head -5
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
