#!/usr/bin/env bash
# Installs, idempotently, what kiln's scripts need beyond a Rust toolchain, and sets the environment.
# Sourced by main.sh, test.sh and .ci/run.
#   - Mesa's Vulkan drivers (lavapipe): a real Vulkan adapter on machines without a GPU, so the WGSL
#     backend runs for real everywhere.
#   - DejaVu fonts: the bench's charts draw their text with a TrueType font.
#   - the wasm32 target, to check that the graph and WGSL crates build for browsers.
#   - Xvfb and the X11 client libraries winit opens: the explorer runs in a real window in CI.

missing=()
for pkg in mesa-vulkan-drivers libvulkan1 fonts-dejavu-core xvfb xauth libxkbcommon-x11-0 libxcursor1 libxrandr2 libxi6 libx11-xcb1; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
  echo "installing ${missing[*]} (Vulkan on any machine, lavapipe where there is no GPU)" >&2
  $sudo apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if command -v rustup >/dev/null 2>&1; then
  rustup target list --installed 2>/dev/null | grep -q '^wasm32-unknown-unknown$' \
    || rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true
fi
# NVIDIA's ptxas (from PyPI, into .tools/), so every generated PTX kernel is assembled even without a GPU.
kiln_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ptxas="$kiln_root/.tools/nvcc/nvidia/cuda_nvcc/bin/ptxas"
if [ ! -x "$ptxas" ] && command -v python3 >/dev/null 2>&1; then
  echo "installing ptxas (nvidia-cuda-nvcc-cu12 from PyPI) into .tools/" >&2
  python3 -m pip install -q --disable-pip-version-check --target "$kiln_root/.tools/nvcc" nvidia-cuda-nvcc-cu12 >/dev/null 2>&1 || true
fi
if [ -x "$ptxas" ]; then
  export KILN_PTXAS="$ptxas"
fi
# The ONNX backend node tests (models, inputs and expected outputs as protobuf files) ship inside the
# `onnx` Python package's wheel: its data folder is unpacked into .tools/ (no Python import needed).
onnx_version="1.20.1"
onnx_nodes="$kiln_root/.tools/onnx-$onnx_version/node"
if [ ! -d "$onnx_nodes" ] && command -v python3 >/dev/null 2>&1; then
  echo "fetching the ONNX node tests (onnx==$onnx_version wheel from PyPI) into .tools/" >&2
  wheel_dir="$(mktemp -d)"
  if python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      -d "$wheel_dir" "onnx==$onnx_version" >/dev/null 2>&1; then
    python3 - "$wheel_dir" "$kiln_root/.tools/onnx-$onnx_version" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
prefix = "onnx/backend/test/data/node/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = os.path.join(sys.argv[2] + ".partial", "node", name[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(z.read(name))
os.rename(sys.argv[2] + ".partial", sys.argv[2])
PY
  fi
  rm -rf "$wheel_dir"
fi
if [ -d "$onnx_nodes" ]; then
  export KILN_ONNX_NODE_TESTS="$onnx_nodes"
fi
# Mesa warns when this is unset or shared; a private 0700 directory keeps logs clean.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR}" ]; then
  XDG_RUNTIME_DIR="$(mktemp -d)"
  chmod 700 "$XDG_RUNTIME_DIR"
  export XDG_RUNTIME_DIR
fi
