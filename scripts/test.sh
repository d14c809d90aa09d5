#!/usr/bin/env bash
# kiln's test command: every unit, integration, conformance (CPU kernels and wgpu), property and doc test.
# Installs what it needs (idempotently) so it works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
cargo test --workspace --locked "$@"
# Name the adapter the wgpu tests ran on.
cargo run -q --locked --example backends
