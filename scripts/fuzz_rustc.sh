#!/usr/bin/env bash
# scripts/fuzz_rustc.sh: the RUSTC_WORKSPACE_WRAPPER of scripts/fuzz.sh's build. Cargo calls it
# for workspace members only; it adds libFuzzer's coverage instrumentation (the flags cargo-fuzz
# gives every crate) to tandem, tandem-ops and the fuzz targets and runs rustc unchanged for the
# rest. Dependencies are thus the test build's own, already built in the same target dir and
# profile, where cargo-fuzz rebuilt each of them instrumented (docs/bench.md, "CI: the fuzz
# targets on the test build's dependencies").
set -euo pipefail
rustc="$1"
shift
# Cargo names the package in the environment of each of its rustc calls; a build script (tandem
# has one) links no libFuzzer and stays uninstrumented.
case "${CARGO_PKG_NAME:-}:${CARGO_CRATE_NAME:-}" in
  *:build_script_*) exec "$rustc" "$@" ;;
  tandem:* | tandem-ops:* | tandem-fuzz:*)
    exec "$rustc" "$@" -Cpasses=sancov-module \
      -Cllvm-args=-sanitizer-coverage-level=4 \
      -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
      -Cllvm-args=-sanitizer-coverage-pc-table \
      -Cllvm-args=-sanitizer-coverage-trace-compares \
      -Cllvm-args=-sanitizer-coverage-stack-depth \
      -Cllvm-args=-simplifycfg-branch-fold-threshold=0 \
      --cfg fuzzing ;;
  *) exec "$rustc" "$@" ;;
esac
