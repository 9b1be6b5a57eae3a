#!/usr/bin/env bash
# Build the burn peer of tandem-bench (bench-suite/burn-driver): burn-onnx generates Rust code
# for each model of models/manifest.json at build time, compiled against burn's ndarray and wgpu
# backends. ~30 min and ~2 GB on this 2-core machine, so it is opt-in, out of CI, in its own
# target dir (default /work/target-burn, override with CARGO_TARGET_DIR) and niced so it does not
# starve other builds. The binary lands in $CARGO_TARGET_DIR/release/burn-driver, where
# tandem-bench looks for it (or set TANDEM_BURN_DRIVER); `burn-driver --list` says per model
# whether burn imported it and, if not, why.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-burn}"
if [ ! -f models/manifest.json ]; then
  echo "models/manifest.json missing: run scripts/fetch_models.py first" >&2
  exit 1
fi
nice -n 19 cargo build --release --locked --manifest-path bench-suite/burn-driver/Cargo.toml "$@"
echo "built $CARGO_TARGET_DIR/release/burn-driver"
"$CARGO_TARGET_DIR/release/burn-driver" --list
