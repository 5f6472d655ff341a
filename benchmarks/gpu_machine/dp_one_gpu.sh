#!/usr/bin/env bash
# Two data-parallel replicas sharing one GPU through Ray's fractional GPUs (0.5 GPU and 0.45 of its memory each),
# beside one engine (0.9 of the memory) on the same GPU: Qwen3-0.6B dummy weights, the nano workload (--repeat 3)
# and the serve benchmark (benchmarks/gpu_machine/serve_bench.sh at $RATES, default "4 16 64 inf").
#   bash benchmarks/gpu_machine/dp_one_gpu.sh [OUTDIR [nano] [serve]]      (default: both parts)
# Needs Ray importable (on the GPU machine: the parts of scripts/pack_ray.sh, unpacked as its header says).
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${1:-/tmp/dp_one_gpu}
parts=${*:2}; parts=${parts:-nano serve}
mkdir -p "$R"
# NOTE: an absolute path: Ray's worker processes do not start in this folder
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export RATES=${RATES:-4 16 64 inf}
DP="--data-parallel-size 2 --gpus-per-replica 0.5 --gpu-memory-utilization 0.45"
BENCH="python3 -m minivllm.entrypoints.bench throughput --model qwen3-0.6b --workload nano --repeat 3"
for side in one dp2; do
  [[ " $parts " == *" nano "* ]] || break
  flags=""; [ $side = dp2 ] && flags=$DP
  timeout 300 $BENCH $flags --json-out "$R/nano_$side.json" > "$R/nano_$side.log" 2>&1 \
    || echo "nano $side failed (see $R/nano_$side.log)"
  tail -14 "$R/nano_$side.log"
done
for side in one dp2; do
  [[ " $parts " == *" serve "* ]] || break
  flags=""; [ $side = dp2 ] && flags=$DP
  SERVE_ARGS="$flags" LABEL=$side timeout 400 bash benchmarks/gpu_machine/serve_bench.sh "$R/serve_$side" 2>&1 | grep -E "label|rate|tok/s|TTFT|TPOT|failed" | head -40
done
python3 - "$R" <<'PY'
import json, pathlib, sys
r = pathlib.Path(sys.argv[1])
for side in ("one", "dp2"):
    f = r / f"nano_{side}.json"
    if f.exists():
        d = json.loads(f.read_text())
        print(f"nano {side}: {d['output_tok_s']:.0f} output tok/s (runs {[round(x['output_tok_s']) for x in d['runs']]})")
    for g in sorted((r / f"serve_{side}").glob("serve_*.json")):
        d = json.loads(g.read_text())
        print(g.name, {k: d.get(k) for k in ("request_rate", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
                                             "median_tpot_ms", "completed")})
PY
