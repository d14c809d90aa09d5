#!/usr/bin/env bash
# Session 36, call 4: runs of few kernels share a Vulkan submission (KILN_WGPU_SUBMIT_EVERY, default 32)
# vs every run its own (=1, as before), alternating, two processes each; kiln CUDA in the same call;
# conformance_wgpu on NVIDIA Vulkan with the batching.
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
e=/tmp/kiln-expect
timeout 150 python3 benches/peers/torch_compile.py --workload W1,W2,W3,W5,W5-train --modes eager --outputs "$e" --json "$o/torch-eager.json" >"$o/torch.log" 2>&1
echo "peer rc=$?"
b() { timeout 100 .gpu/kiln-bench --expect "$e" --modes reduce-overhead "$@"; }
for i in 1 2; do
  KILN_WGPU_SUBMIT_EVERY=1 b --backend wgpu --workload W1,W2,W3,W5,W5-train --json "$o/each-$i.json" --md "$o/each-$i.md" >"$o/each-$i.log" 2>&1
  b --backend wgpu --workload W1,W2,W3,W5,W5-train --json "$o/shared-$i.json" --md "$o/shared-$i.md" >"$o/shared-$i.log" 2>&1
done
b --backend cuda --workload W1,W2,W3,W5 --json "$o/cuda.json" --md "$o/cuda.md" >"$o/cuda.log" 2>&1
for f in each-1 shared-1 each-2 shared-2 cuda; do echo "== $f"; grep -E "^\| W[0-9]" "$o/$f.md" | cut -d'|' -f2-8,12; done
timeout 150 .gpu/tests/conformance_wgpu --test-threads 4 --skip random_graphs >"$o/conf-wgpu.log" 2>&1
echo "conformance rc=$?"; grep -E "test result|FAILED|panicked" "$o/conf-wgpu.log" | head -5
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
