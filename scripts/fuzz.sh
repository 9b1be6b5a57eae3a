#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS]: a bounded run of tandem's libFuzzer targets (runtime/fuzz), the
# seconds (default 60) split evenly over them:
#   load_and_plan    arbitrary bytes as a model: load, plan, run on the CPU
#   generated_graph  bytes -> tandem::fuzzgen model: run on cpu, gpu and auto, outputs compared
# Stable Rust, no cargo-fuzz: the targets are a workspace member built in the test build's
# profile and target dir (`test_profile` of scripts/env.sh: ci when CI=true, else release, or
# TANDEM_TEST_PROFILE), so every dependency is the test build's; scripts/fuzz_rustc.sh, cargo's
# RUSTC_WORKSPACE_WRAPPER, adds libFuzzer's coverage instrumentation to tandem, tandem-ops and
# the targets alone (docs/bench.md, "CI: the fuzz targets on the test build's dependencies").
# Seeds the corpora (runtime/fuzz/seed.sh), then runs each target with -max_total_time,
# -rss_limit_mb=2048 and -timeout=10. A crash fails the script; libFuzzer prints the input it
# saved under runtime/fuzz/artifacts/<target>/ (replay it: `target/<profile>/<target> <file>`,
# after this script's build).
# Longer runs: `bash scripts/fuzz.sh 3600`; the corpora grow across runs.
# In CI (CI=true) libFuzzer's seed is fixed (FUZZ_SEED, default 1) so a CI run is reproducible:
# the same clone explores the same inputs, and a crash it reports replays here. Local runs draw
# a random seed (set FUZZ_SEED to fix one) to explore new ground each time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
total="${1:-60}"
targets=(load_and_plan generated_graph)
per=$(( total / ${#targets[@]} ))
seed_arg=()
if [ -n "${FUZZ_SEED:-}" ] || [ "${CI:-}" = true ]; then
  seed_arg=(-seed="${FUZZ_SEED:-1}")
fi
[ "$per" -ge 1 ] || per=1
. scripts/env.sh
profile=$(test_profile)
bash runtime/fuzz/seed.sh
# No sanitizer: tandem is Rust (ASan, which needs nightly, doubles the build and the run for the
# few unsafe blocks of the CPU kernels). `--workspace` with the targets named: features resolve
# as in the test build (one package alone resolves others and rebuilds wgpu).
start=$(date +%s)
RUSTC_WORKSPACE_WRAPPER="$PWD/scripts/fuzz_rustc.sh" \
  cargo build --profile "$profile" --workspace "${targets[@]/#/--bin=}"
echo "fuzz: build took $(( $(date +%s) - start )) s"
for t in "${targets[@]}"; do
  log="runtime/fuzz/artifacts/$t.log"
  mkdir -p "runtime/fuzz/artifacts/$t"
  status=0
  "target/$profile/$t" -artifact_prefix="runtime/fuzz/artifacts/$t/" -max_total_time="$per" \
    -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 "${seed_arg[@]}" \
    "runtime/fuzz/corpus/$t" >"$log" 2>&1 || status=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  echo "fuzz: $t: $execs executions in ${per} s, exit $status"
  if [ "$status" -ne 0 ]; then
    # The panic's message is on the lines after "panicked at": print them, so a CI log alone
    # says what failed.
    grep -A4 'panicked at' "$log" | head -12 || true
    grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -6
    crash=$(grep -o 'Test unit written to [^ ]*' "$log" | head -1 | sed 's/.* //')
    if [ -n "$crash" ] && [ "$(stat -c %s "$crash")" -le 8192 ]; then
      echo "fuzz: the crashing input, base64: $(base64 -w0 "$crash")"
    fi
    exit "$status"
  fi
done
