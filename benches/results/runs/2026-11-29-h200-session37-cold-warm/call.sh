#!/usr/bin/env bash
# Session 37, call 3: cuBLASLt's heuristic warmed when cuBLAS opens; W5's and W5-train-bf16's cold compiles
# split; CUDA's tests with this build.
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
e=/tmp/kiln-expect
timeout 150 python3 benches/peers/torch_compile.py --workload W5,W5-train-bf16 --modes eager --outputs "$e" --json "$o/torch-eager.json" >"$o/torch-eager.log" 2>&1
echo "peer rc=$?"
cold() { export KILN_CACHE_DIR="$(mktemp -d)" CUDA_CACHE_PATH="$(mktemp -d)"; }
run() {
  cold; KILN_LOGS=graph,launches timeout 90 .gpu/kiln-bench --expect "$e" --backend cuda --workload $2 --modes reduce-overhead --repeat 3 --md "$o/$2-$1.md" >"$o/$2-cold-$1.log" 2>&1
  echo "$2 cold $1 rc=$?"; grep -E "first compile" "$o/$2-cold-$1.log"
  sed 's/\x1b\[[0-9;]*m//g' "$o/$2-cold-$1.log" | grep -E "modules loaded|libraries opened|heuristic|plan made" | sed 's/.*kiln::graph: //' | head -8
}
for i in 1 2 3; do run $i W5; done
KILN_CUDA_PRELOAD_BLAS=0 run nopreload W5
for i in 1 2; do run $i W5-train-bf16; done
for t in device_runtime device_faults; do
  timeout 120 .gpu/tests/$t --include-ignored >"$o/$t.log" 2>&1; echo "$t rc=$?"; grep -E "test result|FAILED|panicked" "$o/$t.log" | head -5
done
timeout 240 .gpu/tests/conformance_cuda --test-threads 4 >"$o/conformance_cuda.log" 2>&1; echo "conformance_cuda rc=$?"
grep -E "test result|FAILED|panicked" "$o/conformance_cuda.log" | head -8
for f in "$o"/*.log; do sed -i 's/\x1b\[[0-9;]*m//g; /k0_reshape host_us/d' "$f"; done
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
