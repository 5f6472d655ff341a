#!/usr/bin/env bash
# Qwen3-30B-A3B beside vLLM 0.24.0 on one machine of two GPUs (dummy weights), in parts, one device call each:
#   bash benchmarks/gpu_machine/moe_side_by_side.sh PART [PART...]
# PART:
#   tune   the fused MoE tiles of this device (grouped, then decode; bf16, FP8 per channel, bf16 at TP=2), written
#          into minivllm/kernels/configs/ (so later parts on this checkout read them) and copied to the logs
#          and /tmp/moe_configs; bf16 (then the TP=2 decode tiles) on GPU 0 while FP8 runs on GPU 1
#   tests  the GPU tier's MoE and two-GPU tests
#   profile  the fused MoE kernel bench (bf16, FP8) and a profile of one decode step at 1 and 256 rows
#   ours   bench throughput one-request (3 runs) and nano (2 runs): bf16 on GPU 0 while FP8 weights run on GPU 1
#   tp2    the same at TP=2 on both GPUs (bf16)
#   vllm   vllm_bench.py on the same workloads: bf16 on GPU 0 while QUANT=fp8 runs on GPU 1, then TP=2
#          (vLLM unpacked in /tmp/site: ../shared/vllm-reference/README.md; the script in $VLLM_BENCH)
#   dp     Qwen3-8B: nano on one GPU, then two data-parallel replicas one per GPU; the serve benchmark at rising
#          request rates on both (needs Ray: scripts/pack_ray.sh)
# Logs in $OUT (the device tool) or /tmp/moe_side_by_side; a summary at the end of each part.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
R=${OUT:-/tmp/moe_side_by_side}
mkdir -p "$R"
M=qwen3-30b-a3b
BENCH="python3 -m minivllm.entrypoints.bench throughput --model $M"
VLLM_BENCH=${VLLM_BENCH:-../shared/vllm-reference/vllm_bench.py}
on() { local gpu=$1; shift; CUDA_VISIBLE_DEVICES=$gpu "$@"; }

ours() {  # ours LABEL GPUS [flags...]
  local label=$1 gpus=$2; shift 2
  on "$gpus" timeout 200 $BENCH --workload one-request --repeat 3 --json-out "$R/${label}_one.json" "$@" \
    > "$R/${label}_one.log" 2>&1 || echo "$label one-request failed"
  on "$gpus" timeout 300 $BENCH --workload nano --repeat 2 --json-out "$R/${label}_nano.json" "$@" \
    > "$R/${label}_nano.log" 2>&1 || echo "$label nano failed"
}

summary() {
  python3 - "$R" <<'PY'
import json, pathlib, sys
r = pathlib.Path(sys.argv[1])
for f in sorted(r.glob("*.json")):
    d = json.loads(f.read_text())
    key, unit, nd = (("ms_per_token", "ms/token", 3) if f.stem.endswith("_one") else ("output_tok_s", "tok/s", 0))
    print(f"{f.stem}: {d[key]:.{nd}f} {unit}, runs {[round(x[key], nd) for x in d.get('runs', [])]}")
for f in sorted(r.glob("serve_*/serve_*.json")):
    d = json.loads(f.read_text())
    print(f.name, {k: d.get(k) for k in ("request_rate", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
                                         "median_tpot_ms", "completed")})
PY
}

for part in "$@"; do
  echo "== $part $(date -u +%H:%M:%S)"
  case $part in
  tune)
    T="timeout 240 python3 benchmarks/kernels/tune_fused_moe.py --model $M --quick --batch-sizes 16 32 64 128 256 1024 4096 8192"
    D="timeout 100 python3 benchmarks/kernels/tune_fused_moe_decode.py --model $M --passes 1"
    (on 0 $T > "$R/tune_bf16.log" 2>&1; on 0 $D > "$R/tune_decode_bf16.log" 2>&1
     on 0 $D --tp 2 > "$R/tune_decode_tp2.log" 2>&1) &
    (on 1 $T --fp8 channel > "$R/tune_fp8.log" 2>&1; on 1 $D --fp8 channel > "$R/tune_decode_fp8.log" 2>&1) &
    wait
    grep -h -E "^M=|wrote|NVIDIA" "$R"/tune_*.log
    tar czf "$R/configs.tgz" -C minivllm/kernels configs && tar tzf "$R/configs.tgz"
    mkdir -p /tmp/moe_configs && cp minivllm/kernels/configs/*.json /tmp/moe_configs/
    ;;
  profile)
    on 0 timeout 100 python3 benchmarks/kernels/fused_moe_bench.py --models $M --ms 1 2 4 8 16 64 256 1024 4096 \
      --no-torch > "$R/moe_kernel_bench.txt" 2>&1; cat "$R/moe_kernel_bench.txt"
    on 1 timeout 100 python3 benchmarks/kernels/fused_moe_bench.py --models $M --ms 1 2 4 8 16 64 256 1024 4096 \
      --fp8 channel > "$R/moe_kernel_bench_fp8.txt" 2>&1; cat "$R/moe_kernel_bench_fp8.txt"
    on 0 timeout 150 python3 benchmarks/engine/profile_step.py --model $M --decode-rows 1 256 \
      > "$R/profile_step.txt" 2>&1; tail -60 "$R/profile_step.txt"
    ;;
  tests)
    timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_fused_moe_gpu.py \
      tests/gpu/test_moe_engine_gpu.py tests/gpu/test_tp_gpu.py tests/gpu/test_pynccl_gpu.py \
      tests/gpu/test_custom_all_reduce_gpu.py -rs > "$R/gpu_tests.log" 2>&1
    tail -15 "$R/gpu_tests.log"
    ;;
  ours)
    ours bf16 0 & ours fp8 1 --quantization fp8 & wait
    summary
    ;;
  tp2)
    ours tp2 0,1 --tensor-parallel-size 2
    summary
    ;;
  vllm)
    export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
    C=$(python3 -c "from minivllm.entrypoints.bench.models import resolve_model; print(resolve_model('$M')[0])")
    (PYTHONPATH=/tmp/site REPEAT=2 on 0 timeout 330 python3 "$VLLM_BENCH" $C nano bs1 > "$R/vllm_bf16.log" 2>&1) &
    (PYTHONPATH=/tmp/site REPEAT=2 QUANT=fp8 on 1 timeout 330 python3 "$VLLM_BENCH" $C nano bs1 \
      > "$R/vllm_fp8.log" 2>&1) &
    wait
    PYTHONPATH=/tmp/site REPEAT=2 TP=2 on 0,1 timeout 240 python3 "$VLLM_BENCH" $C nano bs1 > "$R/vllm_tp2.log" 2>&1
    grep -h -v -E "^(INFO|WARNING|DEBUG)|it/s\]|^\s*$" "$R"/vllm_*.log | tail -30
    ;;
  dp)
    B8="python3 -m minivllm.entrypoints.bench throughput --model qwen3-8b --workload nano --repeat 2"
    on 0 timeout 200 $B8 --json-out "$R/dp_one_nano.json" > "$R/dp_one_nano.log" 2>&1 || echo "one replica failed"
    on 0,1 timeout 260 $B8 --data-parallel-size 2 --json-out "$R/dp_two_nano.json" > "$R/dp_two_nano.log" 2>&1 \
      || echo "two replicas failed"
    for side in one two; do
      flags=""; gpus=0; [ $side = two ] && flags="--data-parallel-size 2" && gpus=0,1
      CUDA_VISIBLE_DEVICES=$gpus SERVE_ARGS="$flags" LABEL=$side RATES="${RATES:-8 32 128 inf}" NUM_PROMPTS=400 \
        timeout 300 bash benchmarks/gpu_machine/serve_bench.sh "$R/serve_$side" qwen3-8b 2>&1 \
        | grep -E "rate|tok/s|TTFT|failed" | head -20
    done
    summary
    ;;
  *) echo "unknown part $part"; exit 2 ;;
  esac
done
