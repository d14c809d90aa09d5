#!/usr/bin/env bash
# kiln's test command: every unit, integration, property and doc test of the workspace.
# Installs what it needs (idempotently) so it works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked "$@"
