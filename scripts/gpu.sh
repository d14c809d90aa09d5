#!/usr/bin/env bash
# Runs kiln's GPU tests (CUDA and wgpu over NVIDIA Vulkan) and the bench on a lent GPU machine, from
# binaries built elsewhere: the machine has no Rust. Build and stage them first with `scripts/gpu.sh
# stage` (test executables and kiln-bench into .gpu/, the Vulkan loader's packages into .gl/), then run
# `scripts/gpu.sh tests|bench|peer` there with .gpu and .gl carried. Logs and reports go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/kiln-gpu-out}"
mkdir -p "$out"
case "${1:-}" in
stage)
  set -e
  rm -rf .gpu/tests .gpu/kiln-bench .gpu/kiln-bench.xz .gpu/profile_workload .gpu/profile_workload.xz .gpu/train_gpt .gpu/train_gpt.xz \
    .gpu/fit_sonnets .gpu/fit_sonnets.xz .gpu/ddp_scaling .gpu/ddp_scaling.xz .gpu/kiln-run .gpu/kiln-run.xz
  mkdir -p .gpu/tests
  cargo test --release --locked -p kiln --test conformance_cuda --test device_runtime --test guards --test onnx_models \
    --test conformance_wgpu --test conformance_wgpu_limits --test device_faults --test torch_parity --test fit --test ddp --no-run --message-format=json 2>/dev/null |
    python3 -c 'import sys, json, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], ".gpu/tests/" + m["target"]["name"])'
  # NCCL's bindings, on a one-rank communicator.
  cargo test --release --locked -p kiln-ptx --test nccl --no-run --message-format=json 2>/dev/null |
    python3 -c 'import sys, json, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], ".gpu/tests/" + m["target"]["name"])'
  cargo build --release --locked -p kiln-bench
  cp target/release/kiln-bench .gpu/
  # One workload's public call, once, for `profile` (Nsight Compute); the training example for `train`,
  # with the font its loss plot needs (a GPU host may have none).
  cargo build --release --locked --example profile_workload --example train_gpt --example fit_sonnets --example ddp_scaling \
    --bin kiln-run
  cp target/release/examples/profile_workload target/release/examples/train_gpt target/release/examples/fit_sonnets \
    target/release/examples/ddp_scaling target/release/kiln-run .gpu/
  cp /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf .gpu/
  # Stripped and compressed: with .gl they must fit a device call's 64 MiB.
  strip .gpu/kiln-bench .gpu/profile_workload .gpu/train_gpt .gpu/fit_sonnets .gpu/ddp_scaling .gpu/kiln-run .gpu/tests/*
  xz -9f -T2 .gpu/kiln-bench .gpu/profile_workload .gpu/train_gpt .gpu/fit_sonnets .gpu/ddp_scaling .gpu/kiln-run .gpu/tests/*
  # ptxas (scripts/deps.sh installs it): CUDA assembles a cold compile's kernels with it, side by side.
  rm -f .gpu/ptxas.xz
  if [ -x .tools/nvcc/nvidia/cuda_nvcc/bin/ptxas ]; then
    xz -9 -T2 -c .tools/nvcc/nvidia/cuda_nvcc/bin/ptxas >.gpu/ptxas.xz
  fi
  du -sh .gpu
  ;;
stage-ddp)
  # Only what `nccl2` and `scaling` run (a full `stage` builds every GPU test: most of an hour here).
  set -e
  rm -rf .gpu/tests .gpu/*.xz .gpu/ddp_scaling .gpu/kiln-run .gpu/fit_sonnets
  mkdir -p .gpu/tests
  for t in "-p kiln --test ddp" "-p kiln-ptx --test nccl"; do
    # shellcheck disable=SC2086
    cargo test --release --locked $t --no-run --message-format=json 2>/dev/null |
      python3 -c 'import sys, json, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], ".gpu/tests/" + m["target"]["name"])'
  done
  cargo build --release --locked --example fit_sonnets --example ddp_scaling --bin kiln-run
  cp target/release/examples/fit_sonnets target/release/examples/ddp_scaling target/release/kiln-run .gpu/
  cp /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf .gpu/
  strip .gpu/fit_sonnets .gpu/ddp_scaling .gpu/kiln-run .gpu/tests/*
  xz -6f -T2 .gpu/fit_sonnets .gpu/ddp_scaling .gpu/kiln-run .gpu/tests/*
  if [ -x .tools/nvcc/nvidia/cuda_nvcc/bin/ptxas ]; then
    xz -6 -T2 -c .tools/nvcc/nvidia/cuda_nvcc/bin/ptxas >.gpu/ptxas.xz
  fi
  du -sh .gpu
  ;;
stage-fps)
  # The explorer and what it needs to run under Xvfb on lavapipe on a machine that has neither: Debian's
  # Xvfb, Mesa's lavapipe and their libraries as .debs in .x11/ (unpacked there into a prefix, not /).
  set -e
  mkdir -p .x11 .gpu
  # Only what a stock Ubuntu 24.04 GPU host lacks: its own libX11, libxcb, libdrm, libpng... are newer, and
  # shipping Debian's ahead of them on the library path could break what links against theirs.
  (cd .x11 && apt-get download xvfb x11-xkb-utils xkb-data mesa-vulkan-drivers libllvm15 libz3-4 libxfont2 \
    libpixman-1-0 libxkbfile1 libfontenc1 libxcvt0 libsensors5 libxcb-dri3-0 libxcb-present0 libxcb-randr0 \
    libxcb-shm0 libxcb-sync1 libxcb-xfixes0 libxshmfence1 libwayland-client0 libx11-xcb1 libunwind8 \
    libxcb-xkb1 libxkbcommon0 libxkbcommon-x11-0 libxcursor1 libxrandr2 libxi6 libxfixes3 libxrender1 libxext6 libfreetype6 libbrotli1)
  cargo build --release --locked -p kiln-app --bin kiln-explorer
  # Compressed: with the .debs it must fit a device call's 64 MiB.
  cp target/release/kiln-explorer .gpu/ && strip .gpu/kiln-explorer && xz -9f .gpu/kiln-explorer
  du -sh .x11 .gpu
  ;;
fps)
  # `fps [SECONDS]`: the explorer's 2,000-node graph panned and zoomed under Xvfb on lavapipe (this
  # machine's CPU cores), then an empty window the same way: the frame rates issue 15 asks for.
  x=/opt/kiln-x11
  mkdir -p "$x"
  for f in .gpu/*.xz; do [ -e "$f" ] && xz -df "$f"; done
  for f in .x11/*.deb; do dpkg -x "$f" "$x"; done
  lib="$x/usr/lib/x86_64-linux-gnu"
  # Xvfb runs xkbcomp from its build-time path; the ICD names its library by absolute path.
  [ -x /usr/bin/xkbcomp ] || cp "$x/usr/bin/xkbcomp" /usr/bin/xkbcomp
  sed "s#/usr/lib/x86_64-linux-gnu#$lib#" "$x/usr/share/vulkan/icd.d/lvp_icd.x86_64.json" > "$x/lvp.json"
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  export LD_LIBRARY_PATH="$lib:$x/lib/x86_64-linux-gnu" VK_DRIVER_FILES="$x/lvp.json" WGPU_BACKEND=vulkan
  export XKB_CONFIG_ROOT="$x/usr/share/X11/xkb"
  export XDG_RUNTIME_DIR="$(mktemp -d)" KILN_CACHE_DIR="$(mktemp -d)" LP_NUM_THREADS="$(nproc)"
  "$x/usr/bin/Xvfb" :77 -screen 0 1920x1080x24 -xkbdir "$x/usr/share/X11/xkb" >"$out/xvfb.log" 2>&1 &
  sleep 2
  export DISPLAY=:77
  echo "cores: $(nproc)"
  for run in 1 2 3; do
    echo "== 2,000-node graph, run $run"
    timeout 120 ./.gpu/kiln-explorer --synthetic 2000 --fps "${2:-10}" 2>&1 | tee -a "$out/fps.log" | grep -E "frames in|adapter|rror" | tail -3
  done
  echo "== empty window"
  timeout 120 ./.gpu/kiln-explorer --fps "${2:-10}" 2>&1 | tee -a "$out/fps.log" | grep -E "frames in|rror" | tail -3
  kill %1 2>/dev/null
  ;;
tests|bench|peer|parts|profile|train|parity|fit|nccl2|scaling)
  # W5's training step alone, as one rank and as two (`ddp_scaling`), TRIALS fresh processes each,
  # bf16-mixed then f32; one JSON line each in $out/ddp_scaling.jsonl.
  # Each step launched (the default), then replayed as a CUDA graph (reduce-overhead).
  scaling() {
    local status=0 prec trial mode
    for mode in "" --reduce-overhead; do
      for prec in --bf16 ""; do
        for trial in $(seq "${TRIALS:-3}"); do
          ./.gpu/ddp_scaling $prec $mode --out "$out/ddp_scaling.jsonl" 2>&1 | tail -1 | cut -c1-160; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
          ./.gpu/kiln-run --gpus 1 -- ./.gpu/ddp_scaling $prec $mode --out "$out/ddp_scaling.jsonl" 2>&1 | tail -1 | cut -c1-160; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
          ./.gpu/kiln-run --gpus 2 -- ./.gpu/ddp_scaling $prec $mode --out "$out/ddp_scaling.jsonl" 2>&1 | tail -1 | cut -c1-160; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        done
      done
    done
    return $status
  }
  for f in .gpu/*.xz .gpu/tests/*.xz; do [ -e "$f" ] && xz -df "$f"; done
  if [ -e .gpu/ptxas ]; then
    chmod +x .gpu/ptxas
    export KILN_PTXAS="$PWD/.gpu/ptxas"
  fi
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export XDG_RUNTIME_DIR="$(mktemp -d)" KILN_CACHE_DIR="$(mktemp -d)"
  # Plots (the training examples' and tests' loss curves) need a font a GPU host may lack.
  mkdir -p /usr/share/fonts/truetype/dejavu && cp .gpu/DejaVuSans.ttf /usr/share/fonts/truetype/dejavu/
  nvidia-smi -L
  case "$1" in
  tests)
    # `tests [test-binary arguments]`: every staged test binary, GPU tests included; arguments (a name
    # filter, `--skip NAME`) go to each binary.
    shift
    status=0
    for t in .gpu/tests/*; do
      [ -x "$t" ] || continue
      echo "== $(basename "$t")"
      # Two-GPU tests run in `nccl2`, on a machine of two.
      "$t" --include-ignored --skip two_gpus "$@" 2>&1 | tee "$out/$(basename "$t").log" | grep -E "^test |test result|panicked|FAILED|random (graphs|gradients):" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
    # A process that opens CUDA and ends at once must exit cleanly while cuBLAS's libraries are still
    # opening in the background (lower-ptx/src/preload.rs; it segfaulted at exit in session 37).
    if [ -x .gpu/tests/conformance_cuda ]; then
      for i in 1 2 3; do
        .gpu/tests/conformance_cuda opening_cuda >/dev/null 2>&1 || { echo "a short CUDA process failed at exit (run $i)"; status=1; }
      done
    fi
    exit $status
    ;;
  train)
    # `train [STEPS]`: examples/train_gpt on CUDA, then on wgpu (the GPU's Vulkan driver) from the same
    # seed, which fails unless its loss curve agrees with CUDA's (window means within 0.05 nats) and
    # both end below the threshold. Curves, plots, checkpoints and samples: $out/train-{cuda,wgpu}/.
    steps="${2:-600}"
    status=0
    for backend in cuda wgpu; do
      agree=()
      [ "$backend" = cuda ] || agree=(--agree-with "$out/train-cuda/loss.csv")
      echo "== train_gpt on $backend, $steps steps"
      ./.gpu/train_gpt --backend "$backend" --steps "$steps" --threshold "${KILN_TRAIN_THRESHOLD:-2.0}" \
        --out "$out/train-$backend" ${agree[@]+"${agree[@]}"} 2>&1 | tr '\r' '\n' | grep -E "train_gpt|rror" | tail -8
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
    exit $status
    ;;
  fit)
    # `fit [EPOCHS]`: examples/fit_sonnets (kiln::fit: epochs with a shorter last batch, validation,
    # checkpoints) on CUDA in f32, CUDA in bf16-mixed and wgpu; metrics and curves in $out/fit-*/.
    epochs="${2:-10}"
    status=0
    for run in cuda cuda-bf16 wgpu; do
      extra=()
      [ "$run" = cuda-bf16 ] && extra=(--bf16)
      echo "== fit_sonnets on $run, $epochs epochs"
      ./.gpu/fit_sonnets --backend "${run%-bf16}" --epochs "$epochs" --out "$out/fit-$run" ${extra[@]+"${extra[@]}"} 2>&1 |
        tr '\r' '\n' | grep -E "fit_sonnets|^epoch|rror" | tail -16
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      # The checkpoints (a few MB a run) stay on the GPU host: the metrics and curves come back.
      rm -rf "$out/fit-$run/checkpoints"
    done
    exit $status
    ;;
  scaling)
    # Only `ddp_scaling` (as in `nccl2`).
    export KILN_RUN="$PWD/.gpu/kiln-run"
    scaling
    ;;
  nccl2)
    # Two GPUs (a machine of two: nvidia-h200-x2 / h100-x2): NCCL through kiln's bindings; data-parallel
    # `fit` against one GPU and a rank that dies (tests/ddp.rs); W5's training step alone, as one rank and
    # as two (`ddp_scaling`, TRIALS fresh processes each, bf16-mixed then f32); fit_sonnets on two ranks.
    nvidia-smi topo -m | head -4
    export KILN_RUN="$PWD/.gpu/kiln-run"
    status=0
    ./.gpu/tests/nccl --include-ignored --nocapture two_gpus 2>&1 | tee "$out/nccl2.log" | grep -E "^test |test result|panicked|rank|NCCL" | tail -20
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    ./.gpu/tests/ddp --include-ignored --nocapture --test-threads 1 2>&1 | tee "$out/ddp.log" | grep -E "^test |test result|panicked|losses|rank 0 stopped|trained in|distributed" | tail -30
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    scaling || status=1
    echo "== fit_sonnets, 2 ranks of 16 windows vs 1 GPU of 32, ${EPOCHS:-5} epochs"
    ./.gpu/kiln-run --gpus 2 -- ./.gpu/fit_sonnets --backend cuda --ddp --batch 16 --epochs "${EPOCHS:-5}" --out "$out/fit-ddp2" 2>&1 |
      tr '\r' '\n' | grep -E "fit_sonnets|epoch|rror" | tail -12
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    ./.gpu/fit_sonnets --backend cuda --batch 32 --epochs "${EPOCHS:-5}" --out "$out/fit-one" 2>&1 |
      tr '\r' '\n' | grep -E "fit_sonnets|epoch|rror" | tail -12
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    rm -rf "$out"/fit-*/checkpoints
    exit $status
    ;;
  parity)
    # Torch parity at W5's size (issue 17): torch's ten AdamW steps of a 4-block, 768-wide GPT on this GPU
    # (float32 and float64, benches/peers/torch_train_parity.py), then kiln's compiled and eager steps on
    # CUDA from the same weights and batches (tests/torch_parity.rs with KILN_PARITY_DIR).
    dir="$(mktemp -d)"
    python3 benches/peers/torch_train_parity.py --out "$dir" --device cuda --vocab 256 --context 512 --dim 768 \
      --heads 12 --layers 4 --batch 8 --lr 1e-3 >"$out/parity-torch.log" 2>&1 || { tail -20 "$out/parity-torch.log"; exit 1; }
    tail -4 "$out/parity-torch.log"
    KILN_PARITY_DIR="$dir" ./.gpu/tests/torch_parity --include-ignored --exact ten_adamw_steps_train_as_torch_does_on_cuda \
      --nocapture 2>&1 | tee "$out/parity.log" | grep -E "compiled|eager|test result|panicked" | tail -12
    exit "${PIPESTATUS[0]}"
    ;;
  bench)
    shift
    ./.gpu/kiln-bench --json "$out/bench.json" --md "$out/bench.md" "$@" 2>&1 | tee "$out/bench.log" | tail -60
    ;;
  peer)
    # `peer [--trials N] [peer args]`: N fresh processes sharing one pair of fresh Inductor/Triton cache
    # dirs, so trial 1 compiles cold and the later ones warm. Reports: $out/torch-<trial>.json. Trial 1
    # alone writes the outputs kiln checks (big files, read by a later bench step on this machine).
    shift
    trials=1 args=()
    while [ $# -gt 0 ]; do
      case "$1" in
      --trials) trials="$2"; shift 2 ;;
      --trials=*) trials="${1#--trials=}"; shift ;;
      *) args+=("$1"); shift ;;
      esac
    done
    caches="$(mktemp -d)"
    export TORCHINDUCTOR_CACHE_DIR="$caches/inductor" TRITON_CACHE_DIR="$caches/triton"
    expect="${KILN_EXPECT_DIR:-$out/expected}"
    status=0
    for t in $(seq 1 "$trials"); do
      if [ "$t" -eq 1 ]; then
        echo "== torch peer, trial 1/$trials: a fresh process, cold caches ($caches); outputs to $expect"
        extra=(--outputs "$expect")
      else
        echo "== torch peer, trial $t/$trials: a fresh process, warm caches (trial 1's, $caches)"
        extra=()
      fi
      PYTHONUNBUFFERED=1 python3 benches/peers/torch_compile.py --json "$out/torch-$t.json" \
        ${extra[@]+"${extra[@]}"} ${args[@]+"${args[@]}"} 2>&1 | tee "$out/torch-$t.log" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
    exit $status
    ;;
  profile)
    # `profile KILN_WORKLOAD [TORCH_WORKLOAD TORCH_MODE]`: each kernel of one call timed by Nsight Compute
    # (its own duration, no launch overhead; caches flushed between kernels), kiln's public call and,
    # when named, torch's (benches/peers/torch_kernels.py, after its warm-up), each summed by kernel name
    # (benches/peers/ncu_summary.py). CSVs: $out/ncu-<side>-<workload>.csv.
    shift
    ncu="$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
    if [ -z "$ncu" ]; then
      echo "no ncu (Nsight Compute) on this machine" >&2
      exit 2
    fi
    metrics=(--clock-control none --metrics gpu__time_duration.sum --csv)
    # application-only: ncu would otherwise follow the ptxas processes a cold compile starts.
    timeout 400 "$ncu" --target-processes application-only "${metrics[@]}" ./.gpu/profile_workload "$1" cuda full --once \
      >"$out/ncu-kiln-$1.csv" 2>"$out/ncu-kiln-$1.log"
    python3 benches/peers/ncu_summary.py "$out/ncu-kiln-$1.csv" 30
    if [ $# -ge 3 ]; then
      timeout 400 "$ncu" --profile-from-start off "${metrics[@]}" python3 benches/peers/torch_kernels.py "$2" "$3" \
        >"$out/ncu-torch-$2.csv" 2>"$out/ncu-torch-$2.log"
      python3 benches/peers/ncu_summary.py "$out/ncu-torch-$2.csv" 30
    fi
    ;;
  parts)
    # `parts SECONDS PART...`: whole comparison runs, one part (a group of workloads) after another, while
    # fewer than SECONDS have passed (a device call has a time limit; the rest go in the next call). Each
    # part: the torch peer in TORCH_TRIALS fresh processes (default 3; trial 1 cold, its outputs kept on this
    # machine), then kiln's bench in KILN_TRIALS fresh processes (default 5) checking every output against
    # torch's float64 outputs; report $out/<part>.{json,md}. Parts: A W1-W3 and dynamic shapes, B LG and
    # W4, C W5 f32 (explicit and SDPA), D W5 bf16, H W1–W3 in bf16, T W5's training step (f32), E W6 (DenseNet-121),
    # Ew W6 on wgpu (the GPU's Vulkan driver).
    shift
    budget="$1"
    shift
    start=$SECONDS
    for part in "$@"; do
      backend=cuda kmodes=
      case "$part" in
      A) kiln=W1,W2,W3,W3-dynamic torch=W1,W2,W3,W3-dynamic modes=all ;;
      B) kiln=LG,W4 torch=LG,W4 modes=all ;;
      # max-autotune spends minutes per W5 variant autotuning its matmul shapes: not in a 10-minute call.
      C) kiln=W5 torch=W5,W5-sdpa modes=default,reduce-overhead,eager ;;
      # The same with torch's SDPA only (its faster attention), for a shorter call.
      Cs) kiln=W5 torch=W5-sdpa modes=default,reduce-overhead,eager ;;
      D) kiln=W5-bf16 torch=W5-bf16,W5-bf16-sdpa modes=default,reduce-overhead,eager ;;
      # W1–W3 in bf16.
      H) kiln=W1-bf16,W2-bf16,W3-bf16 torch=W1-bf16,W2-bf16,W3-bf16 modes=all ;;
      # W5's training step (f32): kiln's one compiled step against torch's compiled model + fused AdamW.
      T) kiln=W5-train torch=W5-train,W5-train-sdpa modes=default,reduce-overhead,eager ;;
      # The same step in bf16 (parameters and moments bf16, the update in f32 on both sides).
      Tb) kiln=W5-train-bf16 torch=W5-train-bf16,W5-train-bf16-sdpa modes=default,reduce-overhead,eager ;;
      # DenseNet-121 (convolutions, batch norm, pooling, concatenation) against torchvision's layers.
      E) kiln=W6 torch=W6 modes=default,reduce-overhead,eager ;;
      # The same on wgpu (the GPU's Vulkan driver; no CUDA graphs there, so kiln's compiled mode; its eager
      # mode, 1,335 launches a call, takes a minute a process and is left out).
      Ew) kiln=W6 torch=W6 modes=default,reduce-overhead backend=wgpu kmodes=reduce-overhead ;;
      *) echo "unknown part $part" >&2; exit 2 ;;
      esac
      if [ $((SECONDS - start)) -ge "$budget" ]; then
        echo "== part $part not started: ${budget}s used"
        continue
      fi
      echo "== part $part ($kiln) at $((SECONDS - start))s"
      export KILN_EXPECT_DIR="/tmp/kiln-expect-$part"
      rm -f "$out"/torch-*.json
      only=()
      [ "$modes" = all ] || only=(--modes "$modes")
      bash "$0" peer --trials "${TORCH_TRIALS:-3}" --workload "$torch" ${only[@]+"${only[@]}"} | grep -vE "^\s*$" | tail -12
      for f in "$out"/torch-*.json; do mv "$f" "$out/$part-$(basename "$f")"; done
      peers=()
      for f in "$out"/"$part"-torch-*.json; do peers+=(--peer "$f"); done
      kiln_only=()
      [ -z "$kmodes" ] || kiln_only=(--modes "$kmodes")
      ./.gpu/kiln-bench --backend "$backend" --trials "${KILN_TRIALS:-5}" --workload "$kiln" \
        ${kiln_only[@]+"${kiln_only[@]}"} ${peers[@]+"${peers[@]}"} --expect "$KILN_EXPECT_DIR" \
        --json "$out/$part.json" --md "$out/$part.md" 2>&1 | tee "$out/$part.log" | grep -E "^\| (W|LG)|kiln-bench" | tail -40
      echo "== part $part done at $((SECONDS - start))s"
    done
    ;;
  esac
  ;;
pack)
  # The device tool returns at most a few files from $OUT: end a call with `scripts/gpu.sh pack`, which
  # leaves one archive of everything written there ($OUT/all.tgz; unpack with `tar xzf`).
  tar czf /tmp/kiln-gpu-all.tgz -C "$out" . && find "$out" -type f -delete && mv /tmp/kiln-gpu-all.tgz "$out/all.tgz"
  ;;
*)
  echo "usage: scripts/gpu.sh stage|stage-fps|fps|pack|tests [test arguments]|train [STEPS]|parity|bench|peer|parts [bench arguments | --trials N and peer arguments]|profile KILN [TORCH MODE]" >&2
  exit 2
  ;;
esac
