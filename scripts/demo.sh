#!/usr/bin/env bash
# Set up (once), then generate text greedily with the demo model shipped in models/.
#   bash scripts/demo.sh ["PROMPT" [MAX_TOKENS]]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
exec "$PY" -m minivllm.entrypoints.cli generate models/minivllm-demo-py --prompt "${1:-def fibonacci(n):}" \
    --max-tokens "${2:-64}" --temperature 0
