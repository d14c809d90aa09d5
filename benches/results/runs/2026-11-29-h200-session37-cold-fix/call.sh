#!/usr/bin/env bash
# Session 37, call 2: W5's cold compile on CUDA after the load's fix (cuBLAS opened after the workers
# start, libraries preloaded at device open); each launch's host time in the first run.
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
e=/tmp/kiln-expect
timeout 150 python3 benches/peers/torch_compile.py --workload W5 --modes eager --outputs "$e" --json "$o/torch-eager.json" >"$o/torch-eager.log" 2>&1
echo "peer rc=$?"
cold() { export KILN_CACHE_DIR="$(mktemp -d)" CUDA_CACHE_PATH="$(mktemp -d)"; }
run() {
  cold; KILN_LOGS=graph,launches timeout 60 .gpu/kiln-bench --expect "$e" --backend cuda --workload W5 --modes reduce-overhead --repeat 3 >"$o/w5-cold-$1.log" 2>&1
  echo "W5 cold $1 rc=$?"; grep -E "first compile" "$o/w5-cold-$1.log"
  sed 's/\x1b\[[0-9;]*m//g' "$o/w5-cold-$1.log" | grep -E "modules loaded|libraries opened" | sed 's/.*kiln::graph: //'
}
for i in 1 2 3; do run $i; done
KILN_CUDA_PRELOAD_BLAS=0 run nopreload
sed 's/\x1b\[[0-9;]*m//g' "$o/w5-cold-1.log" | grep -E "launched|plan made" | sed 's/.*kiln::[a-z]*: //' | head -60
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
