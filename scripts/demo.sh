#!/usr/bin/env bash
# Set up, then generate text with the default model shipped in the repo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh server,triton
PY=${PYTHON:-python3}
"$PY" -m minivllm.entrypoints.cli generate --prompt "${1:-def fibonacci(n):}" --max-tokens "${2:-64}" --temperature 0
