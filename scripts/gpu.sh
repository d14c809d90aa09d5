#!/usr/bin/env bash
# Runs kiln's GPU tests (CUDA and wgpu over NVIDIA Vulkan) and the bench on a lent GPU machine, from
# binaries built elsewhere: the machine has no Rust. Build and stage them first with `scripts/gpu.sh
# stage` (test executables and kiln-bench into .gpu/, the Vulkan loader's packages into .gl/), then run
# `scripts/gpu.sh tests|bench|peer` there with .gpu and .gl carried. Logs and reports go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/kiln-gpu-out}"
mkdir -p "$out"
case "${1:-}" in
stage)
  set -e
  mkdir -p .gpu/tests
  cargo test --release --locked -p kiln --test conformance_cuda --test device_runtime --test guards \
    --test conformance_wgpu --no-run --message-format=json 2>/dev/null |
    python3 -c 'import sys, json, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], ".gpu/tests/" + m["target"]["name"])'
  cargo build --release --locked -p kiln-bench
  cp target/release/kiln-bench .gpu/
  du -sh .gpu
  ;;
tests|bench|peer)
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export XDG_RUNTIME_DIR="$(mktemp -d)" KILN_CACHE_DIR="$(mktemp -d)"
  nvidia-smi -L
  case "$1" in
  tests)
    status=0
    for t in .gpu/tests/*; do
      echo "== $(basename "$t")"
      "$t" --include-ignored 2>&1 | tee "$out/$(basename "$t").log" | grep -E "^test |test result|panicked|FAILED" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
    exit $status
    ;;
  bench)
    shift
    ./.gpu/kiln-bench --json "$out/bench.json" --md "$out/bench.md" "$@" 2>&1 | tee "$out/bench.log" | tail -60
    ;;
  peer)
    shift
    PYTHONUNBUFFERED=1 python3 benches/peers/torch_compile.py --json "$out/torch.json" "$@" 2>&1 | tee "$out/torch.log" | tail -40
    ;;
  esac
  ;;
*)
  echo "usage: scripts/gpu.sh stage|tests|bench|peer [bench or peer arguments]" >&2
  exit 2
  ;;
esac
