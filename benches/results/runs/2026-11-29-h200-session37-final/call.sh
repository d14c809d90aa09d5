#!/usr/bin/env bash
# Session 37, call 9: the final build — CUDA's tests and a plain run's exit, device_runtime on wgpu and
# CUDA, and wgpu's public call with the default wait (no KILN_WGPU_SPIN_US set).
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
for i in 1 2 3; do timeout 60 .gpu/tests/conformance_cuda >"$o/conformance_cuda-plain-$i.log" 2>&1; echo "conformance_cuda plain $i rc=$?"; done
timeout 120 .gpu/tests/device_runtime --include-ignored >"$o/device_runtime.log" 2>&1; echo "device_runtime rc=$?"; grep -E "test result|FAILED|panicked" "$o/device_runtime.log" | head -3
timeout 120 .gpu/tests/conformance_cuda --include-ignored --test-threads 4 >"$o/conformance_cuda.log" 2>&1; echo "conformance_cuda rc=$?"; grep -E "test result|FAILED|panicked" "$o/conformance_cuda.log" | head -3
e=/tmp/kiln-expect
timeout 100 python3 benches/peers/torch_compile.py --workload W1,W2,W3 --modes eager --outputs "$e" --json "$o/torch-eager.json" >"$o/torch-eager.log" 2>&1
echo "peer rc=$?"
unset KILN_WGPU_SPIN_US
timeout 90 .gpu/kiln-bench --expect "$e" --backend wgpu --workload W1,W2,W3 --modes compiled --md "$o/wgpu.md" >"$o/wgpu.log" 2>&1
echo "wgpu rc=$?"; grep -E "^\| W[123] \| wgpu" "$o/wgpu.md" | cut -d'|' -f2-7
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
