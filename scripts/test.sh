#!/usr/bin/env bash
# Set up, then run the test suite (GPU tests skip without CUDA; Triton kernels run in the interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh server,triton,test
PY=${PYTHON:-python3}
"$PY" -m ruff check minivllm tests benchmarks scripts
"$PY" -m pytest -q "$@"
