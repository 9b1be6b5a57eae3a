#!/usr/bin/env bash
# scripts/gpu_check.sh: tandem's GPU, model and hybrid tests and the bench, on another x86-64
# Linux machine that has a GPU but no Rust toolchain and no network (a lent GPU machine):
#   bash scripts/gpu_check.sh pack [DIR]
#       here: the release test binaries, tandem and tandem-bench (stripped, one xz archive of
#       about 20 MB: the binaries share most of their code, so a 256 MiB dictionary packs them
#       together), and models/ (without minilm and the download cache) with conformance-data/
#       (about 38 MB), into DIR (default .gpucheck/, git-ignored); DIR/root holds this
#       checkout's path. About 3 minutes on 2 cores once the release build is there.
#   bash scripts/gpu_check.sh run [DIR] [tests|bench|all|kernels] [THREADS]
#       there, in a copy of this checkout holding DIR: unpacks, then runs the tests (each with
#       a time limit) and/or `tandem-bench run` of the 14 models ($MODELS to choose) on cpu,
#       gpu and auto against onnxruntime (`python3` must import it) with THREADS (default:
#       all cores); `kernels`: all-GPU runs of $KERNEL_MODELS with the workgroup-memory Conv
#       and MatMul kernels and without (`TANDEM_GPU_TILED=0`), processes in A B B A order,
#       each one's median of 30 runs. Logs and reports go to $OUT (default /tmp/gpucheck);
#       the last line says how many failed, and the exit status is non-zero if any did. A
#       test binary still running at its limit leaves its threads' names, wait channels,
#       states and kernel stacks in $OUT/hang_<test>.txt before it is killed.
# The test binaries read models/ and conformance-data/ under the path they were built in: run
# makes that path a link to the copy when they differ. CI=true is set, so a missing adapter
# fails instead of skipping. Vulkan: if ldconfig finds no libvulkan.so.1, the .deb files in
# .gl/ are unpacked first (`apt-get download libvulkan1` where a registry is reachable), and
# NVIDIA's ICD is used where its driver files are.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cmd="${1:-}"
dir="${2:-.gpucheck}"
tests=(ops_lib gpu_data_movement gpu_elementwise gpu_layer gpu_linalg gpu_norm_reduce_pool
  split_equivalence numerics faults busy_gpu schedule conformance models hybrid_plans stress)
models="${MODELS:-magika ppocr_det yolov8n tiny_llama_prefill tiny_llama_decode
  light_bvlc_alexnet light_densenet121 light_inception_v1 light_inception_v2 light_resnet50
  light_shufflenet light_squeezenet light_vgg19 light_zfnet512}"
kernel_models="${KERNEL_MODELS:-light_resnet50 yolov8n light_vgg19 light_densenet121 ppocr_det
  tiny_llama_prefill light_squeezenet magika}"

pack() {
  set -e
  . scripts/env.sh
  mkdir -p "$dir/bin"
  local json
  json=$(mktemp)
  cargo test --release --workspace --no-run --message-format=json >"$json"
  cargo build --release --workspace -q
  python3 - "$json" "$dir/bin" "${tests[@]}" <<'EOF'
import json, shutil, sys
src, dst, want = sys.argv[1], sys.argv[2], set(sys.argv[3:])
for line in open(src):
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    name = "ops_lib" if (t["name"], t["kind"]) == ("tandem_ops", ["lib"]) else t["name"]
    if name in want and (name == "ops_lib" or t["kind"] == ["test"]):
        shutil.copy(m["executable"], f"{dst}/{name}")
        want.discard(name)
if want:
    sys.exit(f"gpu_check: no test binary for {sorted(want)}")
EOF
  rm -f "$json"
  cp target/release/tandem target/release/tandem-bench "$dir/bin/"
  strip "$dir/bin/"*
  tar -cf - -C "$dir" bin | xz -T2 -9 --lzma2=preset=9,dict=256MiB >"$dir/bin.tar.xz"
  rm -rf "$dir/bin"
  tar --exclude=models/minilm --exclude=models/.cache -cf - models conformance-data |
    xz -T2 -6 >"$dir/data.tar.xz"
  pwd -P >"$dir/root"
  du -sh "$dir"
}

run() {
  local what="${3:-all}" threads="${4:-$(nproc)}" out="${OUT:-/tmp/gpucheck}" t0=$SECONDS
  log() { echo "[$((SECONDS - t0))s] $*"; }
  mkdir -p "$out"
  if [ -d .gl ] && ! ldconfig -p | grep -q libvulkan.so.1; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
  fi
  local nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -f "$nv" ] && export VK_DRIVER_FILES=$nv VK_ICD_FILENAMES=$nv
  export CI=true TANDEM_BENCH_PYTHON="${TANDEM_BENCH_PYTHON:-python3}"
  export XDG_RUNTIME_DIR="/tmp/xdg-$(id -u)"
  mkdir -p -m 700 "$XDG_RUNTIME_DIR"
  local root
  root=$(cat "$dir/root")
  if [ "$(pwd -P)" != "$root" ] && [ ! -e "$root" ]; then
    mkdir -p "$(dirname "$root")" && ln -s "$(pwd -P)" "$root"
  fi
  tar -xJf "$dir/bin.tar.xz" -C "$dir"
  [ -f models/manifest.json ] || tar -xJf "$dir/data.tar.xz"
  local b="$dir/bin"
  { nproc; grep -m1 'model name' /proc/cpuinfo; "$b/tandem" info; } >"$out/info.txt" 2>&1
  log "unpacked; $(grep -m1 '^GPU' "$out/info.txt")"
  local failed=0
  if [ "$what" = tests ] || [ "$what" = all ]; then
    : >"$out/tests.log"
    for t in "${tests[@]}"; do
      local args=() limit=120
      case $t in
        conformance) args=(--nocapture) ;;
        models) args=(--skip minilm) ;;
        hybrid_plans) export TANDEM_HYBRID_MODELS=magika:20,tiny_llama_prefill:40,tiny_llama_decode:40,ppocr_det:5,yolov8n:5 ;;
      esac
      echo "===== $t" >>"$out/tests.log"
      "$b/$t" "${args[@]}" >>"$out/tests.log" 2>&1 &
      local pid=$! rc
      for _ in $(seq $((limit * 2))); do
        sleep 0.5
        kill -0 $pid 2>/dev/null || break
      done
      if kill -0 $pid 2>/dev/null; then
        # A hang: each thread's name, wait channel, state and kernel stack, then kill it.
        for task in /proc/$pid/task/*; do
          echo "$(cat "$task/comm") $(cat "$task/wchan") $(cut -d' ' -f3 "$task/stat")"
          head -8 "$task/stack" 2>/dev/null
        done >"$out/hang_$t.txt"
        kill -9 $pid
        wait $pid 2>/dev/null
        rc=124
      else
        wait $pid
        rc=$?
      fi
      [ "$rc" -eq 0 ] || failed=$((failed + 1))
      log "$t rc=$rc: $(grep -a 'test result' "$out/tests.log" | tail -1 | cut -c1-70)"
    done
    grep -a '^conformance:' "$out/tests.log" | tail -1
  fi
  if [ "$what" = kernels ]; then
    for m in $kernel_models; do
      local dims=()
      [ "$m" = yolov8n ] && dims=(--dim batch=1 --dim height=320 --dim width=320)
      for tiled in 0 1 1 0; do
        TANDEM_GPU_TILED=$tiled timeout 120 "$b/tandem" run "models/$m/model.onnx" "${dims[@]}" \
          --placement gpu --runs 30 >"$out/kernels.txt" 2>&1 || failed=$((failed + 1))
        log "kernels $m TANDEM_GPU_TILED=$tiled: $(grep -o 'median latency.*' "$out/kernels.txt")"
      done
    done
  fi
  if [ "$what" = bench ] || [ "$what" = all ]; then
    # shellcheck disable=SC2086  # the model list is words
    timeout 540 "$b/tandem-bench" run $models --placements cpu,gpu,auto --peers onnxruntime \
      --adapter vulkan --threads "$threads" --iters 10 --secs 0.3 --max-secs 4 --gpu-iters 10 \
      --gpu-secs 0.3 --gpu-max-secs 4 --out "$out/bench" >"$out/bench.log" 2>&1
    local rc=$?
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
    log "bench rc=$rc ($out/bench/report.md)"
    rm -rf "$out/bench/work"
  fi
  log "done: $failed failed"
  [ "$failed" -eq 0 ]
}

case "$cmd" in
  pack) pack ;;
  run) run "$@" ;;
  *)
    sed -n '2,20p' "$0"
    exit 2
    ;;
esac
