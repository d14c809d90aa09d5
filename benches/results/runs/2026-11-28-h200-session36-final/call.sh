#!/usr/bin/env bash
# Session 36, call 5: the final build on NVIDIA — every conformance_wgpu test (the random graphs too) and
# device_runtime (wgpu and CUDA); W5's cold compile on CUDA, stage by stage; W3 on CUDA by row threads.
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
timeout 200 .gpu/tests/conformance_wgpu --test-threads 4 >"$o/conf-wgpu.log" 2>&1
echo "conformance_wgpu rc=$?"; grep -E "random graphs:|test result|FAILED|panicked" "$o/conf-wgpu.log" | head -5
timeout 60 .gpu/tests/device_runtime --include-ignored >"$o/device-runtime.log" 2>&1
echo "device_runtime rc=$?"; grep -E "test result|FAILED|panicked" "$o/device-runtime.log" | head -5
e=/tmp/kiln-expect
timeout 90 python3 benches/peers/torch_compile.py --workload W3,W5 --modes eager --outputs "$e" >"$o/torch.log" 2>&1
echo "peer rc=$?"
KILN_LOGS=graph timeout 60 .gpu/kiln-bench --expect "$e" --backend cuda --workload W5 --modes reduce-overhead --repeat 3 >"$o/w5-cold.log" 2>&1
grep -E "first compile|ptxas|render" "$o/w5-cold.log" | head -12
for t in 128 512; do
  KILN_CUDA_ROW_THREADS=$t timeout 40 .gpu/kiln-bench --expect "$e" --backend cuda --workload W3 --modes reduce-overhead --md "$o/w3-rt$t.md" >"$o/w3-rt$t.log" 2>&1
  echo "W3 row threads $t: $(grep -E '^\| W3' "$o/w3-rt$t.md" | cut -d'|' -f4,5 | tr '\n' ' ')"
done
timeout 40 .gpu/kiln-bench --expect "$e" --backend cuda --workload W3 --modes reduce-overhead --md "$o/w3-rt256.md" >"$o/w3-rt256.log" 2>&1
echo "W3 row threads 256: $(grep -E '^\| W3' "$o/w3-rt256.md" | cut -d'|' -f4,5 | tr '\n' ' ')"
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
