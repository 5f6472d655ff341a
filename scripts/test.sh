#!/usr/bin/env bash
# Set up (once), then lint and run the whole test suite on the CPU: the fast tier and the slow tier
# (the GPU tier is deselected without CUDA; Triton kernels run in Triton's interpreter; a skip outside the
# allowlist in tests/conftest.py fails the run). What CI runs.
#   bash scripts/test.sh [PYTEST ARGS]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh server,triton,test,ray,lora
PY=${PYTHON:-python3}
"$PY" -m ruff check minivllm tests benchmarks scripts
"$PY" -m pytest -q -m "" tests benchmarks/tests "$@"
