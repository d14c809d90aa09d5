#!/usr/bin/env bash
# Session 37, call 8: W1 and W3 in f32 and bf16, kiln (read-only loads) beside torch's modes in the same
# call, for issue 14's 0.95x bars.
source .gpu/setup.sh
o=$OUT/r; mkdir -p "$o"
e=/tmp/kiln-expect
export TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)" TRITON_CACHE_DIR="$(mktemp -d)"
timeout 240 python3 benches/peers/torch_compile.py --workload W1,W3,W1-bf16,W3-bf16 --modes eager,default,reduce-overhead,max-autotune-no-cudagraphs --outputs "$e" --json "$o/torch.json" >"$o/torch.log" 2>&1
echo "peer rc=$?"
python3 -c "
import json
for r in json.load(open('$o/torch.json'))['results']: print(r['workload'], r['mode'], round(r['median_ms'],4), round(r.get('call_ms') or 0,4), r.get('cold_compile_ms'))"
for i in 1 2; do
  timeout 120 .gpu/kiln-bench --expect "$e" --backend cuda --workload W1,W3,W1-bf16,W3-bf16 --modes reduce-overhead --peer "$o/torch.json" --md "$o/kiln-$i.md" --json "$o/kiln-$i.json" >"$o/kiln-$i.log" 2>&1
  echo "kiln $i rc=$?"; grep -E '^\| W[13](-bf16)? \| cuda' "$o/kiln-$i.md" | cut -d'|' -f2,4,5,6,13 | tr -s ' '
done
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$o"
