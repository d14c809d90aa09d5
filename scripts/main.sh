#!/usr/bin/env bash
# kiln's main job. Until the bench lands (issue: headless bench), it runs the quickstart end to end on
# the best backend found (CUDA when that lowering lands, else any wgpu adapter — lavapipe counts — else the
# CPU reference) and prints the captured graph and its kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
cargo run --release --locked --example quickstart
