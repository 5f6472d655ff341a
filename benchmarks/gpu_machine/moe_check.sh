#!/usr/bin/env bash
# The MoE checks of one GPU call: the kernel and engine GPU tests, the kernel benchmark at Qwen3-30B-A3B's shapes,
# and bench throughput on Qwen3-30B-A3B (dummy weights). Logs in $OUT (the device tool) or /tmp/moe_check.
#   bash benchmarks/gpu_machine/moe_check.sh [NANO_REPEAT]
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
R=${OUT:-/tmp/moe_check}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$R/device.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_fused_moe_gpu.py \
  tests/gpu/test_moe_engine_gpu.py > "$R/moe_gpu_tests.log" 2>&1; tail -25 "$R/moe_gpu_tests.log"
timeout 70 python3 benchmarks/kernels/fused_moe_bench.py --models qwen3-30b-a3b --ms 1 8 64 256 1024 4096 \
  > "$R/moe_kernel_bench.txt" 2>&1; tail -14 "$R/moe_kernel_bench.txt"
BENCH="python3 -m minivllm.entrypoints.bench throughput --model qwen3-30b-a3b"
timeout 120 $BENCH --workload one-request --repeat 3 --json-out "$R/moe_one.json" > "$R/moe_one.log" 2>&1
tail -8 "$R/moe_one.log"
timeout 170 $BENCH --workload nano --repeat "${1:-1}" --json-out "$R/moe_nano.json" > "$R/moe_nano.log" 2>&1
tail -8 "$R/moe_nano.log"
