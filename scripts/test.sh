#!/usr/bin/env bash
# kiln's test command: every unit, integration, conformance (CPU kernels and wgpu), property and doc test.
# Installs what it needs (idempotently) so it works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
# CUDA tests need an NVIDIA driver; without one they are skipped here, explicitly and loudly (they run
# on the lent GPU, see README). Any other missing piece fails the tests with what to install.
if [ -z "${KILN_CUDA_TESTS:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  echo "test.sh: no CUDA driver (libcuda.so.1) here: CUDA tests skipped (KILN_CUDA_TESTS=skip)" >&2
  export KILN_CUDA_TESTS=skip
fi
cargo test --workspace --locked "$@"
# Name the adapter the wgpu tests ran on.
cargo run -q --locked --example backends
