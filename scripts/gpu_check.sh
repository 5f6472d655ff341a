#!/usr/bin/env bash
# The GPU suite and the benchmarks in one call, with a short table printed last.
#   bash scripts/gpu_check.sh [SECTION ...]      sections: tests bench06 bench8b hf profile sampler kernels serve
# Results (JSON, logs, plots) go to /tmp/gpu_check; with $OUT set (the device tool), also as $OUT/results.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
R=/tmp/gpu_check
mkdir -p "$R"
sections=${*:-tests bench06 bench8b hf profile}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$R/device.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$R/device.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$R/device.txt"
bench() { python3 -m minivllm.entrypoints.bench throughput "$@" 2>&1 | tail -16; }
for s in $sections; do
  case $s in
    tests) python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider 2>&1 | tee "$R/gpu_tests.log" | tail -15 ;;
    bench06)
      for w in nano fixed-batch one-request; do bench --model qwen3-0.6b --workload $w --repeat 3 --json-out "$R/q06_$w.json"; done ;;
    bench8b)
      for w in nano one-request; do bench --model qwen3-8b --workload $w --repeat 3 --json-out "$R/q8b_$w.json"; done ;;
    hf) python3 benchmarks/hf_baseline.py --model qwen3-0.6b --json-out "$R/q06_hf_fixed.json" 2>&1 | tail -8 ;;
    profile) python3 benchmarks/profile_step.py --model benchmarks/configs/qwen3-0.6b > "$R/profile.txt" 2>&1;
             grep -A12 "^## " "$R/profile.txt" | grep -v "^--$" | head -40 ;;
    sampler) python3 benchmarks/bench_sampler.py 2>&1 | tee "$R/sampler.txt" | tail -12 ;;
    kernels) python3 benchmarks/bench_kernels.py 2>&1 | tee "$R/kernels.txt" | tail -25 ;;
    serve) bash scripts/serve_bench.sh "$R" 2>&1 | tail -30 ;;
    *) echo "unknown section $s" ;;
  esac
done
[ -n "${OUT:-}" ] && tar czf "$OUT/results.tgz" -C "$R" .
python3 scripts/gpu_summary.py "$R"
