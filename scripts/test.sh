#!/usr/bin/env bash
# kiln's test command: every unit, integration, conformance (CPU kernels and wgpu), property and doc test.
# Installs what it needs (idempotently) so it works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
# Tests write compile-cache entries; keep them out of the user's cache (a fresh directory per run).
if [ -z "${KILN_CACHE_DIR:-}" ]; then
  KILN_CACHE_DIR="$(mktemp -d)"
  export KILN_CACHE_DIR
  trap 'rm -rf "$KILN_CACHE_DIR"' EXIT
fi
# Property tests draw from a fixed seed unless one is given: what passes here passes in CI, commit for
# commit. Explore with other draws by setting PROPTEST_RNG_SEED yourself (any u64).
export PROPTEST_RNG_SEED="${PROPTEST_RNG_SEED:-20261123}"
echo "test.sh: property tests use PROPTEST_RNG_SEED=$PROPTEST_RNG_SEED" >&2
# CUDA tests need an NVIDIA GPU: they are marked ignored (the harness counts them as such) and run here
# with --include-ignored wherever a CUDA driver exists. Any other missing piece fails the tests with what
# to install.
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  echo "test.sh: CUDA driver found: running the GPU tests too (--include-ignored)" >&2
  # Tests named two_gpus_* need two GPUs: on fewer they are filtered out (and counted as such), said here.
  gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
  skip=()
  if [ "${gpus:-0}" -lt 2 ]; then
    echo "test.sh: ${gpus:-0} GPU(s) here: the two_gpus_* tests are filtered out" >&2
    skip=(--skip two_gpus)
  fi
  cargo test --workspace --locked "$@" -- --include-ignored ${skip[@]+"${skip[@]}"}
else
  echo "test.sh: no CUDA driver (libcuda.so.1) here: the CUDA tests show as ignored" >&2
  cargo test --workspace --locked "$@"
fi
# Name the adapter the wgpu tests ran on.
cargo run -q --locked --example backends
# A user's own backend (torch's `backend=`): it records every kernel and delegates to wgpu; it exits
# non-zero when its answers differ from the reference.
kernels="$(mktemp -d)"
cargo run -q --locked --example custom_backend "$kernels"
rm -rf "$kernels"
