#!/usr/bin/env bash
# Short fuzz runs of kiln's inputs from outside (fuzz/: report, graph and case JSON, compile-cache
# entries, the symbolic simplifier against evaluation, ONNX models): `scripts/fuzz.sh [SECONDS]` runs each target
# that long (default 60) from the committed seeds, with libFuzzer under nightly Rust. A crash fails the
# run and leaves its input in fuzz/artifacts/<target>/ (make it a regression test). Installs cargo-fuzz
# (pinned) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz.sh: no nightly toolchain (cargo fuzz needs one): rustup toolchain install nightly" >&2
  exit 1
fi
if ! cargo fuzz --version 2>/dev/null | grep -q '0.13.2'; then
  env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS cargo install cargo-fuzz --version 0.13.2 --locked
fi
for target in report_json graph_json cache_entry sym_simplify onnx_model; do
  corpus="$(mktemp -d)"
  cp fuzz/seeds/"$target"/* "$corpus"/
  start=$SECONDS
  log="$corpus.log"
  # -rss_limit_mb: a decoded file asking for a huge tensor is an error, not an allocation.
  set +e
  cargo +nightly fuzz run --fuzz-dir fuzz "$target" "$corpus" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1
  status=$?
  set -e
  grep -E "^(stat::number_of_executed_units|SUMMARY|thread '|Done [0-9]+ runs)|panicked|Test unit written" "$log" || true
  [ "$status" -eq 0 ] || tail -40 "$log"
  rm -rf "$corpus" "$log"
  echo "fuzz.sh: $target ran $((SECONDS - start)) s, exit $status"
  [ "$status" -eq 0 ] || exit "$status"
done
