#!/usr/bin/env bash
# Session 37, call 7: loads of read-only buffers through ld.global.nc (ptxas may move them above stores)
# against the same code without (kiln-bench-old), CUDA, alternating fresh processes; torch's modes on W3
# in the same call; conformance_cuda with the new loads.
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
e=/tmp/kiln-expect
timeout 150 python3 benches/peers/torch_compile.py --workload W1,W2,W3,W5 --modes eager --outputs "$e" --json "$o/torch-eager.json" >"$o/torch-eager.log" 2>&1
echo "peer rc=$?"
for i in 1 2; do
  for b in old new; do
    bin=.gpu/kiln-bench; [ $b = old ] && bin=.gpu/kiln-bench-old
    timeout 120 $bin --expect "$e" --backend cuda --workload W1,W2,W3,W5 --modes reduce-overhead --md "$o/$b-$i.md" --json "$o/$b-$i.json" >"$o/$b-$i.log" 2>&1
    echo "$b $i rc=$?: $(grep -E '^\| W[1235] \| cuda \| (compiled|reduce)' "$o/$b-$i.md" | cut -d'|' -f2,4,5,6 | tr -s ' ' | tr '\n' ';')"
  done
done
timeout 200 .gpu/tests/conformance_cuda --include-ignored --test-threads 4 >"$o/conformance_cuda.log" 2>&1; echo "conformance_cuda rc=$?"
grep -E "test result|FAILED|panicked|random (graphs|gradients):" "$o/conformance_cuda.log" | head -8
export TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)" TRITON_CACHE_DIR="$(mktemp -d)"
timeout 150 python3 benches/peers/torch_compile.py --workload W3 --modes default,reduce-overhead,max-autotune,max-autotune-no-cudagraphs --json "$o/torch-w3.json" >"$o/torch-w3.log" 2>&1
echo "torch W3 rc=$?"
python3 -c "
import json
for r in json.load(open('$o/torch-w3.json'))['results']: print(r['workload'], r['mode'], round(r['median_ms'],4), r.get('call_ms'))"
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
