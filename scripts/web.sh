#!/usr/bin/env bash
# The browser demo (web/): the explorer and the whole compiler built for wasm32, computing on the
# visitor's WebGPU device.
#   scripts/web.sh build        builds the static page into web/dist (relative paths: any static host)
#   scripts/web.sh serve [PORT] builds it and serves it on http://127.0.0.1:PORT (default 8080)
#   scripts/web.sh check        builds it and drives it in headless Chromium, with WebGPU and without
# Installs what it needs, idempotently: the wasm32 target, wasm-bindgen-cli at the version Cargo.lock
# pins (into .tools/, reused), Chromium and chromedriver for `check`, binaryen's wasm-opt from npm (into
# .tools/; the page ships unoptimised where npm is missing, or with KILN_WEB_WASM_OPT=0).
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
source scripts/deps.sh
root="$(pwd)"
dist="$root/web/dist"

bindgen() {
  local version bin
  version="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3; exit }' Cargo.lock)"
  bin="$root/.tools/wasm-bindgen-$version/bin/wasm-bindgen"
  if [ ! -x "$bin" ]; then
    echo "web.sh: installing wasm-bindgen-cli $version (the version Cargo.lock pins) into .tools/" >&2
    # Its own lock file first; where the registry lacks a version it names, the newest compatible ones.
    # Without a lint wrapper CI may have set for kiln's own crates (an installed tool is not kiln's to lint).
    env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS cargo install -q --locked wasm-bindgen-cli --version "$version" --root "$root/.tools/wasm-bindgen-$version" >&2 \
      || env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS cargo install -q wasm-bindgen-cli --version "$version" --root "$root/.tools/wasm-bindgen-$version" >&2
  fi
  [ -x "$bin" ] || { echo "web.sh: wasm-bindgen-cli $version did not install" >&2; return 1; }
  echo "$bin"
}

build() {
  local bin wasm start=$SECONDS
  bin="$(bindgen)"
  cargo build --locked --profile web --target wasm32-unknown-unknown -p kiln-web --lib
  wasm="target/wasm32-unknown-unknown/web/kiln_web.wasm"
  rm -rf "$dist"
  "$bin" --target web --no-typescript --out-dir "$dist" "$wasm"
  # Shrinks the wasm by about a quarter (a tenth gzipped). binaryen 132 from npm (pinned: its wasm-opt
  # is a JS build, ~4.5 minutes here); Debian's binaryen 108 broke the page (wasm-bindgen's externref
  # table: "WebAssembly.Table.set(): Argument 1 is invalid"), so a wasm-opt on PATH is not used.
  local opt="$root/.tools/binaryen-132/node_modules/.bin/wasm-opt"
  if [ "${KILN_WEB_WASM_OPT:-1}" = 0 ]; then
    # CI's choice (its time budget): the page is checked as rustc and wasm-bindgen wrote it.
    echo "web.sh: KILN_WEB_WASM_OPT=0: wasm-opt not run" >&2
    opt=""
  elif [ ! -x "$opt" ] && command -v npm >/dev/null 2>&1; then
    echo "web.sh: installing binaryen 132.0.0 from npm into .tools/ (for wasm-opt)" >&2
    npm install --silent --no-audit --no-fund --prefix "$root/.tools/binaryen-132" binaryen@132.0.0 >&2 || true
  fi
  if [ -n "$opt" ] && [ -x "$opt" ]; then
    local opt_start=$SECONDS
    "$opt" -Os --enable-bulk-memory --enable-nontrapping-float-to-int --enable-reference-types --enable-sign-ext \
      --enable-mutable-globals --enable-multivalue -o "$dist/kiln_web_bg.wasm" "$dist/kiln_web_bg.wasm"
    echo "web.sh: wasm-opt -Os (binaryen 132) took $((SECONDS - opt_start)) s" >&2
  elif [ -n "$opt" ]; then
    echo "web.sh: no npm here for binaryen's wasm-opt: the wasm is as rustc wrote it" >&2
  fi
  cp web/static/index.html "$dist/"
  local raw gz
  raw="$(stat -c %s "$dist/kiln_web_bg.wasm")"
  gz="$(gzip -9 -c "$dist/kiln_web_bg.wasm" | wc -c)"
  echo "web.sh: built $dist in $((SECONDS - start)) s: kiln_web_bg.wasm $((raw / 1024)) KiB, $((gz / 1024)) KiB gzipped" >&2
}

# apt_install COMMAND PACKAGE...: installs Debian's PACKAGEs unless COMMAND is already here.
apt_install() {
  local cmd="$1" sudo=""
  shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
  echo "web.sh: installing Debian's $*" >&2
  $sudo apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

chromium() {
  command -v chromedriver >/dev/null 2>&1 || apt_install chromedriver chromium chromium-driver
  apt_install chromium chromium chromium-driver
}

case "${1:-build}" in
  build) build ;;
  serve)
    build
    port="${2:-8080}"
    echo "web.sh: serving $dist on http://127.0.0.1:$port/ (Ctrl-C stops)" >&2
    cd "$dist" && exec python3 -m http.server "$port" --bind 127.0.0.1
    ;;
  check)
    build
    chromium
    cargo build --locked -q -p kiln-web --bin kiln-web-check
    ./target/debug/kiln-web-check --dist "$dist" --webgpu on --run W1,W2,W3,W4,W5 --calls 5
    ./target/debug/kiln-web-check --dist "$dist" --webgpu off --run W1,W2,W3 --calls 3
    ;;
  *)
    echo "usage: scripts/web.sh build | serve [PORT] | check" >&2
    exit 2
    ;;
esac
