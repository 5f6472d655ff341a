#!/usr/bin/env bash
# Install minivllm (editable) and its dependencies into the current Python, unless already done.
#   bash scripts/setup.sh [EXTRAS]     e.g. server,triton,test
# Without an NVIDIA GPU, torch is pinned to the CPU wheel (2.13.0) so pip does not pull CUDA packages.
# A stamp in .cache/ records each finished set-up (the Python, pyproject.toml's hash, the extras): a later
# call that asks for no more is a no-op, as long as `import minivllm` finds this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=${1:-}
stamp=.cache/setup.stamp
key="$("$PY" -c 'import sys; print(sys.executable)') $(sha256sum pyproject.toml | cut -c1-16)"
installed() {  # every requested extra appears on a stamp line of this Python and pyproject.toml
  local line
  line=$(grep -F "$key " "$stamp" 2>/dev/null | tail -1) || return 1
  for e in ${extras//,/ }; do [[ ",${line#"$key "}," == *",$e,"* ]] || return 1; done
  # NOTE: from another folder, so that the installed package is found, not this folder's
  local here; here=$(pwd -P)
  (cd / && "$PY" -c "import minivllm, os, sys; sys.exit(not os.path.realpath(minivllm.__file__).startswith('$here/'))") 2>/dev/null
}
if installed; then
  exit 0
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
  "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q --root-user-action=ignore -e ".${extras:+[$extras]}"
mkdir -p .cache
prev=$(grep -F "$key " "$stamp" 2>/dev/null | tail -1 | cut -d' ' -f3) || true
echo "$key $(echo "${prev:+$prev,}$extras" | tr ',' '\n' | grep -v '^$' | sort -u | paste -sd, -)" >> "$stamp"
