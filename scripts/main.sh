#!/usr/bin/env bash
# kiln's main job. Until the bench lands (issue: headless bench), it runs the quickstart end to end on
# the best backend this build has (today: the CPU reference) and prints the captured graph.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release --locked --example quickstart
