#!/usr/bin/env bash
# Session 37, call 6: the public call's synchronise on NVIDIA Vulkan — blocking on the fence vs polling
# first (KILN_WGPU_SPIN_US); a tiny call's host split, and W1–W3's public call on wgpu.
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
for sp in 0 100 500 2000 0 2000; do echo "wgpu spin $sp: $(KILN_WGPU_SPIN_US=$sp timeout 60 .gpu/call_overhead wgpu 256 2>&1 | tail -1)"; done
echo "cuda: $(timeout 60 .gpu/call_overhead cuda 256 2>&1 | tail -1)"
e=/tmp/kiln-expect
timeout 150 python3 benches/peers/torch_compile.py --workload W1,W2,W3 --modes eager --outputs "$e" --json "$o/torch-eager.json" >"$o/torch-eager.log" 2>&1
echo "peer rc=$?"
for sp in 0 2000 0 2000; do
  KILN_WGPU_SPIN_US=$sp timeout 120 .gpu/kiln-bench --expect "$e" --backend wgpu --workload W1,W2,W3 --modes compiled --md "$o/wgpu-spin$sp-$RANDOM.md" >>"$o/wgpu-spin$sp.log" 2>&1
  echo "spin $sp rc=$?"
done
for f in "$o"/wgpu-spin*.md; do echo "$f"; grep -E "^\| W[123] \| wgpu" "$f" | cut -d'|' -f2-7; done
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
