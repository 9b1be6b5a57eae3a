#!/usr/bin/env bash
# scripts/test.sh: set up this machine if needed, then run every check: formatting, clippy, and
# all tests (shader validation, ops on CPU and GPU, conformance, real models against onnxruntime).
# GPU tests run on the machine's adapter (lavapipe when there is no GPU) and fail, never skip,
# when there is none.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
. scripts/env.sh
ensure_rust_components
echo "test: cargo fmt --check"
cargo fmt --all --check
echo "test: cargo clippy"
cargo clippy --release --workspace --all-targets -q -- -D warnings
echo "test: cargo test"
cargo test --release --workspace
echo "test: MatMul, attention and Conv on Cpu adapters through storage buffers (TANDEM_GPU_TEXTURES=0)"
# `--workspace`, not `-p tandem`: one package alone resolves other features and rebuilt wgpu,
# tandem and their dependencies (6 minutes of CI on a 2-core machine).
TANDEM_GPU_TEXTURES=0 cargo test --release --workspace --test gpu_linalg --test fusion -- \
  matmul gemm attention::the_attention_op conv_gpu_
echo "test: tandem-bench run --quick (magika on every placement and peer; docs/bench.md)"
# Built for the whole workspace, so its dependencies have the features `cargo test` unified:
# `cargo run -p tandem-bench` resolves them for that one package and rebuilt tract, wgpu and
# ~100 other crates (15 minutes of CI on a 2-core machine).
cargo build --release --workspace -q
target/release/tandem-bench run --quick --out target/bench-quick
echo "test: browser demo (scripts/web.sh test: tandem cpu/gpu/auto and onnxruntime-web in headless Chromium)"
bash scripts/web.sh test
# Bounded fuzzing (60 s over the cargo-fuzz targets, ~3 min cold build into runtime/fuzz/target):
# in CI, or locally with TANDEM_FUZZ=1. Longer runs: bash scripts/fuzz.sh SECONDS.
if [ "${CI:-}" = "true" ] || [ "${TANDEM_FUZZ:-}" = "1" ]; then
  echo "test: bounded fuzzing (scripts/fuzz.sh 60)"
  bash scripts/fuzz.sh 60
fi
