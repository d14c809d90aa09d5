#!/usr/bin/env bash
# Session 37, call 5: the preload only opens the libraries; cuBLASLt warmed inside a graph's load.
# conformance_cuda run plainly five times (its exit), W5 and W5-train-bf16 cold, device_runtime.
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
for i in 1 2 3 4 5; do timeout 60 .gpu/tests/conformance_cuda >"$o/conformance_cuda-plain-$i.log" 2>&1; echo "conformance_cuda plain $i rc=$?"; done
e=/tmp/kiln-expect
timeout 150 python3 benches/peers/torch_compile.py --workload W5,W5-train-bf16 --modes eager --outputs "$e" --json "$o/torch-eager.json" >"$o/torch-eager.log" 2>&1
echo "peer rc=$?"
cold() { export KILN_CACHE_DIR="$(mktemp -d)" CUDA_CACHE_PATH="$(mktemp -d)"; }
run() {
  cold; KILN_LOGS=graph timeout 90 .gpu/kiln-bench --expect "$e" --backend cuda --workload $2 --modes reduce-overhead --repeat 3 --md "$o/$2-$1.md" >"$o/$2-cold-$1.log" 2>&1
  echo "$2 cold $1 rc=$?"; grep -E "first compile" "$o/$2-cold-$1.log"
  sed 's/\x1b\[[0-9;]*m//g' "$o/$2-cold-$1.log" | grep -E "modules loaded|libraries opened|heuristic" | sed 's/.*kiln::graph: //' | head -5
}
for i in 1 2 3; do run $i W5; done
for i in 1 2; do run $i W5-train-bf16; done
timeout 120 .gpu/tests/device_runtime --include-ignored >"$o/device_runtime.log" 2>&1; echo "device_runtime rc=$?"; grep -E "test result|FAILED|panicked" "$o/device_runtime.log" | head -5
timeout 200 .gpu/tests/conformance_cuda --include-ignored --test-threads 4 >"$o/conformance_cuda.log" 2>&1; echo "conformance_cuda rc=$?"
grep -E "test result|FAILED|panicked|random (graphs|gradients):" "$o/conformance_cuda.log" | head -8
for f in "$o"/*.log; do sed -i 's/\x1b\[[0-9;]*m//g' "$f"; done
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
