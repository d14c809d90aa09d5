#!/usr/bin/env bash
# kiln's main job: the bench on the best backend found (CUDA, else any wgpu
# adapter — lavapipe counts, at quick sizes — else the CPU reference). Writes bench-report.{md,json,svg}.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
cargo run --release --locked -p kiln-bench -- --json bench-report.json --md bench-report.md --chart bench-report.svg "$@"
