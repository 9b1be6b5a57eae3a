#!/usr/bin/env bash
# runtime/fuzz/seed.sh: fill the fuzz corpora (runtime/fuzz/corpus/, not committed).
#   load_and_plan:   the real models under models/ smaller than 2 MB, and every 8th ONNX
#                    node-test model of conformance-data/ (scripts/setup.sh makes both).
#   generated_graph: 32 random byte strings (fixed seed); fuzzgen turns any bytes into a model.
# Idempotent: files are named by content, so running it again adds nothing new.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$here/../.."
lp="$here/corpus/load_and_plan"
gg="$here/corpus/generated_graph"
mkdir -p "$lp" "$gg"
add() { cp "$1" "$lp/$(sha1sum "$1" | cut -c1-16).onnx"; }
n=0
if [ -d "$root/models" ]; then
  while IFS= read -r f; do add "$f"; n=$((n + 1)); done \
    < <(find "$root/models" -name '*.onnx' -size -2M | sort)
fi
m=0
if [ -d "$root/conformance-data" ]; then
  while IFS= read -r f; do add "$f"; m=$((m + 1)); done \
    < <(find "$root/conformance-data" -name model.onnx | sort | awk 'NR % 8 == 1')
fi
python3 - "$gg" <<'PY'
import os, random, sys
rng = random.Random(6)
for i in range(32):
    with open(os.path.join(sys.argv[1], f"seed{i:02}"), "wb") as f:
        f.write(bytes(rng.randrange(256) for _ in range(rng.choice([64, 256, 1024]))))
PY
echo "seed: load_and_plan $n real models + $m node-test models; generated_graph 32 random inputs"
