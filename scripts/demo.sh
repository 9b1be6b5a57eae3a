#!/usr/bin/env bash
# scripts/demo.sh: set up this machine if needed, then run the demo (`tandem` with no arguments):
# magika classifies files of this repository on the CPU and on the GPU, with per-node placement.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --skip-conformance
. scripts/env.sh
cargo run --release -q -p tandem-cli --bin tandem -- "$@"
