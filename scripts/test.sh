#!/usr/bin/env bash
# scripts/test.sh: set up this machine if needed, then run every check: formatting, clippy,
# rustdoc and all tests (shader validation, ops on CPU and GPU, conformance, real models against
# onnxruntime).
# GPU tests run on the machine's adapter (lavapipe when there is no GPU) and fail, never skip,
# when there is none.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Each step's line carries the seconds since the start, so a CI log shows where the time goes.
step() { echo "test: $* [${SECONDS} s]"; }
bash scripts/setup.sh
. scripts/env.sh
profile=$(test_profile)
ensure_rust_components
step "cargo fmt --check"
cargo fmt --all --check
step "cargo clippy"
cargo clippy --profile "$profile" --workspace --all-targets -q -- -D warnings
step "cargo doc (broken links in the docs fail; about 10 s after clippy)"
RUSTDOCFLAGS="-D warnings" cargo doc --profile "$profile" --workspace --no-deps -q
step "cargo test (profile $profile)"
cargo test --profile "$profile" --workspace
step "MatMul, attention and Conv on Cpu adapters through storage buffers (TANDEM_GPU_TEXTURES=0)"
# `--workspace`, not `-p tandem`: one package alone resolves other features and rebuilt wgpu,
# tandem and their dependencies (6 minutes of CI on a 2-core machine).
TANDEM_GPU_TEXTURES=0 cargo test --profile "$profile" --workspace --test gpu_linalg \
  --test fusion -- matmul gemm attention::the_attention_op conv_gpu_
step "tandem-bench run --quick (magika on every placement and peer, then pinned; docs/bench.md)"
# Built for the whole workspace, so its dependencies have the features `cargo test` unified:
# `cargo run -p tandem-bench` resolves them for that one package and rebuilt tract, wgpu and
# ~100 other crates (15 minutes of CI on a 2-core machine).
cargo build --profile "$profile" --workspace -q
if [ "$profile" = ci ]; then
  echo "note: tract is unoptimised in the ci profile: its times below check it runs, not its speed"
fi
"target/$profile/tandem-bench" run --quick --out target/bench-quick
# Pinned threads: tandem's pool and onnxruntime's `session.intra_op_thread_affinities`, which
# onnxruntime refuses at load when malformed.
"target/$profile/tandem-bench" run --quick --pin-threads --placements cpu --peers onnxruntime \
  --out target/bench-quick-pinned
step "browser demo (scripts/web.sh test: tandem cpu/gpu/auto and onnxruntime-web in headless Chromium)"
TANDEM_TEST_PROFILE="$profile" bash scripts/web.sh test
# Bounded fuzzing (60 s over the libFuzzer targets of runtime/fuzz, built on this profile's
# dependencies with tandem and tandem-ops instrumented): in CI, or locally with TANDEM_FUZZ=1.
# Longer runs: bash scripts/fuzz.sh SECONDS.
if [ "${CI:-}" = "true" ] || [ "${TANDEM_FUZZ:-}" = "1" ]; then
  step "bounded fuzzing (scripts/fuzz.sh 60)"
  TANDEM_TEST_PROFILE="$profile" bash scripts/fuzz.sh 60
fi
step "done"
