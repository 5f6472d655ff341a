#!/usr/bin/env bash
# Install minivllm and its dependencies into the current Python.
# Without an NVIDIA GPU, torch is pinned to the CPU wheel (2.13.0) so pip does not pull CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=${1:-server,triton}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
  "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[${extras}]"
