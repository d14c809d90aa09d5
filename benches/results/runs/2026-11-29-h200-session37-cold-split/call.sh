#!/usr/bin/env bash
# Session 37, call 1: W5's cold compile on CUDA split by stage (three fresh processes, one with eager
# module loading); kiln's max-autotune on CUDA beside torch's max-autotune-no-cudagraphs.
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
e=/tmp/kiln-expect
timeout 150 python3 benches/peers/torch_compile.py --workload W1,W2,W3,W5 --modes eager --outputs "$e" --json "$o/torch-eager.json" >"$o/torch-eager.log" 2>&1
echo "peer rc=$?"
cold() { export KILN_CACHE_DIR="$(mktemp -d)" CUDA_CACHE_PATH="$(mktemp -d)"; }
for i in 1 2 3; do
  cold; KILN_LOGS=graph timeout 60 .gpu/kiln-bench --expect "$e" --backend cuda --workload W5 --modes reduce-overhead --repeat 3 >"$o/w5-cold-$i.log" 2>&1
  echo "W5 cold $i rc=$?"; grep -E "first compile" "$o/w5-cold-$i.log"; grep -E "modules loaded|ptxas" "$o/w5-cold-$i.log" | sed 's/.*kiln::graph: //' | head -12
done
cold; CUDA_MODULE_LOADING=EAGER KILN_LOGS=graph timeout 60 .gpu/kiln-bench --expect "$e" --backend cuda --workload W5 --modes reduce-overhead --repeat 3 >"$o/w5-cold-eager.log" 2>&1
echo "W5 cold eager-loading rc=$?"; grep -E "first compile" "$o/w5-cold-eager.log"; grep -E "modules loaded" "$o/w5-cold-eager.log" | sed 's/.*kiln::graph: //'
for i in 1 2; do
  cold; timeout 120 .gpu/kiln-bench --expect "$e" --backend cuda --workload W1,W2,W3,W5 --modes reduce-overhead,max-autotune --json "$o/ma-$i.json" --md "$o/ma-$i.md" >"$o/ma-$i.log" 2>&1
  echo "kiln max-autotune $i rc=$?"; grep -E "max-autotune:" "$o/ma-$i.log"; grep -E "^\| W" "$o/ma-$i.md" | cut -d'|' -f2-6,13
done
cold; export TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)" TRITON_CACHE_DIR="$(mktemp -d)"
timeout 200 python3 benches/peers/torch_compile.py --workload W1,W2,W3 --modes default,max-autotune-no-cudagraphs --json "$o/torch-ma.json" >"$o/torch-ma.log" 2>&1
echo "torch ma rc=$?"
python3 -c "
import json
for r in json.load(open('$o/torch-ma.json'))['results']: print(r['workload'], r['mode'], round(r['median_ms'],4), r.get('cold_compile_ms'))"
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
