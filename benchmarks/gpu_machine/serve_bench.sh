#!/usr/bin/env bash
# Start `minivllm serve` on a dummy Qwen3-0.6B and run `minivllm bench serve` at three request rates.
#   bash benchmarks/gpu_machine/serve_bench.sh OUTDIR [MODEL]
# $SERVE_ARGS: more `minivllm serve` flags (e.g. "--data-parallel-size 2 --gpus-per-replica 0.5
# --gpu-memory-utilization 0.45"); $LABEL: a suffix of the results' label; $RATES: the request rates (default "4 16 64").
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${1:-/tmp/serve_bench}; M=${2:-qwen3-0.6b}
mkdir -p "$R"
if [ -d .whl ] && ! python3 -c "import fastapi, uvicorn" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
PORT=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
MODEL_DIR=$(python3 -c "from minivllm.entrypoints.bench.models import resolve_model; print(resolve_model('$M')[0])")
python3 -m minivllm.entrypoints.cli serve "$MODEL_DIR" --load-format dummy --port "$PORT" \
    --served-model-name "$M" --max-model-len 4096 ${SERVE_ARGS:-} > "$R/server.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for rate in ${RATES:-4 16 64}; do
  timeout 120 python3 -m minivllm.entrypoints.bench serve --base-url "http://127.0.0.1:$PORT" --model "$M" --token-ids \
      --num-prompts "${NUM_PROMPTS:-200}" --input-len 256 --output-len 128 --request-rate "$rate" --ready-timeout 150 --max-token-id "${MAX_TOKEN_ID:-10000}" \
      --label "minivllm $M${LABEL:+ $LABEL}" --json-out "$R/serve_${M}${LABEL:+_$LABEL}_rate${rate}.json" 2>&1 | tail -14
done
python3 benchmarks/engine/plot.py "$R" 2>&1 | tail -3
