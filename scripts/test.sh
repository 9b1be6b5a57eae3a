#!/usr/bin/env bash
# scripts/test.sh: set up this machine if needed, then run every check: formatting, clippy, and
# all tests (shader validation, ops on CPU and GPU, conformance, real models against onnxruntime).
# GPU tests run on the machine's adapter (lavapipe when there is no GPU) and fail, never skip,
# when there is none.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Each step's line carries the seconds since the start, so a CI log shows where the time goes.
step() { echo "test: $* [${SECONDS} s]"; }
# The cargo profile of the build: `release` here, `ci` in CI (release with tract, a bench peer,
# unoptimised: half the test build's CPU time otherwise; Cargo.toml), or TANDEM_TEST_PROFILE.
profile="${TANDEM_TEST_PROFILE:-release}"
if [ -z "${TANDEM_TEST_PROFILE:-}" ] && [ "${CI:-}" = "true" ]; then profile=ci; fi
bash scripts/setup.sh
. scripts/env.sh
ensure_rust_components
# Bounded fuzzing (60 s over the cargo-fuzz targets) in CI, or locally with TANDEM_FUZZ=1. Its
# build (about 800 s of CPU on 2 cores, into runtime/fuzz/target, so it holds no lock of the
# builds below) starts now under SCHED_IDLE, which runs it only on a core nothing else wants
# (tests waiting on lavapipe, downloads, Chromium); the fuzzing step at the end waits for it.
# It is not free: a test of many small graphs ran 1.5-2x slower beside it (docs/bench.md).
fuzz_build=""
if [ "${CI:-}" = "true" ] || [ "${TANDEM_FUZZ:-}" = "1" ]; then
  mkdir -p target
  idle=(nice -n 19)
  if command -v chrt >/dev/null; then idle=(chrt --idle 0); fi
  # Its own process group (job control on for this one launch), for the EXIT trap to stop it
  # whole; not its own session (setsid): the kernel's autogroups share the CPU equally between
  # sessions, whatever the priority (clippy took 352 s instead of 205 that way).
  set -m
  "${idle[@]}" bash scripts/fuzz.sh --build-only >target/fuzz-build.log 2>&1 &
  fuzz_build=$!
  set +m
  trap 'kill -- -"$fuzz_build" 2>/dev/null || true' EXIT
  echo "test: fuzz build started in the background (log: target/fuzz-build.log)"
fi
step "cargo fmt --check"
cargo fmt --all --check
step "cargo clippy"
cargo clippy --profile "$profile" --workspace --all-targets -q -- -D warnings
step "cargo test (profile $profile)"
cargo test --profile "$profile" --workspace
step "MatMul, attention and Conv on Cpu adapters through storage buffers (TANDEM_GPU_TEXTURES=0)"
# `--workspace`, not `-p tandem`: one package alone resolves other features and rebuilt wgpu,
# tandem and their dependencies (6 minutes of CI on a 2-core machine).
TANDEM_GPU_TEXTURES=0 cargo test --profile "$profile" --workspace --test gpu_linalg \
  --test fusion -- matmul gemm attention::the_attention_op conv_gpu_
step "tandem-bench run --quick (magika on every placement and peer; docs/bench.md)"
# Built for the whole workspace, so its dependencies have the features `cargo test` unified:
# `cargo run -p tandem-bench` resolves them for that one package and rebuilt tract, wgpu and
# ~100 other crates (15 minutes of CI on a 2-core machine).
cargo build --profile "$profile" --workspace -q
if [ "$profile" = ci ]; then
  echo "note: tract is unoptimised in the ci profile: its times below check it runs, not its speed"
fi
"target/$profile/tandem-bench" run --quick --out target/bench-quick
step "browser demo (scripts/web.sh test: tandem cpu/gpu/auto and onnxruntime-web in headless Chromium)"
TANDEM_TEST_PROFILE="$profile" bash scripts/web.sh test
# Longer fuzzing runs: bash scripts/fuzz.sh SECONDS.
if [ -n "$fuzz_build" ]; then
  step "bounded fuzzing (scripts/fuzz.sh 60, after its background build)"
  built=0
  wait "$fuzz_build" || built=$?
  trap - EXIT
  tail -n 3 target/fuzz-build.log
  if [ "$built" -ne 0 ]; then
    echo "test: the fuzz build failed (exit $built); the end of target/fuzz-build.log:"
    tail -n 40 target/fuzz-build.log
    exit "$built"
  fi
  bash scripts/fuzz.sh 60
fi
step "done"
