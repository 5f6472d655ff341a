#!/usr/bin/env bash
# The GPU test suite and the benchmarks in one call, with a short table printed last.
#   bash benchmarks/gpu_machine/gpu_check.sh [SECTION ...]        (default: tests bench06 bench8b)
# sections:
#   tests      the GPU suite (tests/gpu; the tests that need 2+ GPUs skip on one)
#   bench06    Qwen3-0.6B: nano, fixed-batch, one-request, each --repeat 3 (dummy weights)
#   bench8b    Qwen3-8B: nano, one-request, each --repeat 3
#   compare    before/after on one machine: for each model in $CMP_MODELS (default "qwen3-0.6b qwen3-8b") and workload
#              in $CMP_WORKLOADS (default "nano one-request"), the tree at $BEFORE (a checkout of the earlier commit)
#              then this tree, --repeat 3 each, one right after the other
#   latency    minivllm bench latency, batch 8, 128 in / 128 out, Qwen3-0.6B and 8B
#   serve      benchmarks/gpu_machine/serve_bench.sh on Qwen3-0.6B (needs fastapi/uvicorn wheels in .whl/ on the GPU machine)
#   hf         transformers' generate on the fixed batch, beside ours (benchmarks/engine/hf_baseline.py)
#   profile    benchmarks/engine/profile_step.py on Qwen3-0.6B (host phases, kernel table)
#   kernels    benchmarks/kernels/decode_attention.py, gemv.py, sampler.py (decode attention, GEMV, sampler)
#   lazy       benchmarks/engine/lazy_compiles.py: no Triton kernel compiles after start-up
#   structured benchmarks/structured/bench_structured.py: grammar masks of 256 rows x 151,936 tokens, and nano with
#              25% of requests under a JSON schema against nano unconstrained (needs llguidance from .whl/ and the
#              tokenizer in .bench/bigtok, made by benchmarks/structured/big_tokenizer.py)
#   fp8tests   the FP8 GPU tests (weights, fused quantization, block GEMM, KV cache) and the FP8 kernel benchmarks
#              (decode attention over bf16 / e4m3 caches, the FP8 GEMMs, the fused quantization)
#   fp8nano    Qwen3-8B nano --repeat 3 for each of $FP8_CONFIGS (default "bf16 w8 kv8": bf16; FP8 weights;
#              FP8 KV cache; "w8kv8": both)
#   fp8one     Qwen3-8B one-request --repeat 3, bf16 and FP8 weights
#   tp         benchmarks/engine/tp_scaling.py on Qwen3-8B at TP sizes $TP_SIZES (default "1 2"; 2+ GPUs)
# Results (JSON, logs) go to /tmp/gpu_check; with $OUT set (the device tool), also as $OUT/results.tgz.
# NOTE: the device tool brings back at most 8 files from $OUT: leave results.tgz there rather than copies of each file.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
R=/tmp/gpu_check
mkdir -p "$R"
sections=${*:-tests bench06 bench8b}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$R/device.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$R/device.txt"
BENCH="python3 -m minivllm.entrypoints.bench throughput"  # NOTE: `timeout` cannot run a shell function
# NOTE: every section has a time limit and the results are archived after each one, so a section
# that hangs cannot take the others' results with it.
save() { [ -n "${OUT:-}" ] && tar czf "$OUT/results.tgz" -C "$R" . ; true; }
here() { PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} "$@"; }
for s in $sections; do
  case $s in
    tests) here timeout 560 python3 -m pytest tests/gpu -q -p no:cacheprovider -m "gpu" > "$R/gpu_tests.log" 2>&1
           tail -15 "$R/gpu_tests.log" ;;
    bench06) for w in nano fixed-batch one-request; do
               here timeout 150 $BENCH --model qwen3-0.6b --workload $w --repeat 3 --json-out "$R/q06_$w.json" 2>&1 | tail -14; done ;;
    bench8b) for w in nano one-request; do
               here timeout 200 $BENCH --model qwen3-8b --workload $w --repeat 3 --json-out "$R/q8b_$w.json" 2>&1 | tail -14; done ;;
    compare) [ -d "${BEFORE:-}" ] || { echo "compare: set BEFORE to a checkout of the earlier commit"; continue; }
             for M in ${CMP_MODELS:-qwen3-0.6b qwen3-8b}; do for w in ${CMP_WORKLOADS:-nano one-request}; do
               for side in before after; do
                 tree=$PWD; [ $side = before ] && tree=$(cd "$BEFORE" && pwd)
                 (cd "$tree" && PYTHONPATH=$tree timeout 240 $BENCH --model $M --workload $w --repeat ${CMP_REPEAT:-3} \
                    --json-out "$R/cmp_${M}_${w}_$side.json" > "$R/cmp_${M}_${w}_$side.log" 2>&1) \
                   || echo "compare: $M $w $side failed (see $R/cmp_${M}_${w}_$side.log)"
                 save; done; done; done ;;
    latency) for M in qwen3-0.6b qwen3-8b; do
               here timeout 150 python3 -m minivllm.entrypoints.bench latency --model $M --batch-size 8 --input-len 128 \
                 --output-len 128 --num-iters 3 --json-out "$R/${M}_latency.json" 2>&1 | tail -10; done ;;
    serve) here timeout 300 bash benchmarks/gpu_machine/serve_bench.sh "$R" 2>&1 | tail -40 ;;
    hf) here timeout 150 python3 benchmarks/engine/hf_baseline.py --model qwen3-0.6b --run-ours --json-out "$R/q06_hf_fixed.json" 2>&1 | tail -8 ;;
    profile) here timeout 200 python3 benchmarks/engine/profile_step.py --model qwen3-0.6b > "$R/profile.txt" 2>&1
             grep -A12 "^## " "$R/profile.txt" | grep -v "^--$" | head -40 ;;
    kernels) here timeout 200 python3 benchmarks/kernels/decode_attention.py --cuda-graph > "$R/kernels.txt" 2>&1; tail -20 "$R/kernels.txt"
             here timeout 200 python3 benchmarks/kernels/gemv.py --rows 1 16 > "$R/gemv.txt" 2>&1; tail -20 "$R/gemv.txt"
             here timeout 90 python3 benchmarks/kernels/sampler.py --fused > "$R/sampler.txt" 2>&1; tail -12 "$R/sampler.txt" ;;
    lazy) here timeout 300 python3 benchmarks/engine/lazy_compiles.py --model qwen3-0.6b --json-out "$R/lazy.json" > "$R/lazy.txt" 2>&1
          grep -v "^  \[" "$R/lazy.txt" | tail -14 ;;
    structured) [ -d .bench/bigtok ] || here timeout 200 python3 benchmarks/structured/big_tokenizer.py .bench/bigtok
                here timeout 200 python3 benchmarks/structured/bench_structured.py mask --tokenizer .bench/bigtok \
                  --threads ${SO_THREADS:-8} --json-out "$R/so_mask.json" 2>&1 | tail -6
                here timeout 500 python3 benchmarks/structured/bench_structured.py nano --tokenizer .bench/bigtok \
                  --repeat ${SO_REPEAT:-3} --json-out "$R/so_nano.json" 2>&1 | tail -3 ;;
    fp8tests) here timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_fp8_weights_gpu.py \
                tests/gpu/test_fp8_block_gemm_gpu.py tests/gpu/test_fused_quant_gpu.py tests/gpu/test_fp8_kv_gpu.py \
                > "$R/fp8_tests.log" 2>&1; tail -6 "$R/fp8_tests.log"
              for kv in "bf16" "fp8" "fp8 --tiles bf16"; do
                here timeout 60 python3 benchmarks/kernels/decode_attention.py --cuda-graph --heads 32 8 128 --batches 64 256 \
                  --contexts 1024 --block-sizes 16 --kv-dtype $kv 2>&1 | tail -3; done
              here timeout 90 python3 benchmarks/kernels/decode_attention.py --cuda-graph --heads 32 8 128 --batches 256 \
                --contexts 1024 --block-sizes 16 --kv-dtype fp8 --configs 64x2x4 128x2x4 64x3x4 128x3x8 64x4x4 2>&1 | tail -2
              here timeout 120 python3 benchmarks/kernels/fp8_gemm.py > "$R/fp8_gemm.txt" 2>&1; tail -40 "$R/fp8_gemm.txt"
              here timeout 60 python3 benchmarks/kernels/fused_quant.py 2>&1 | tail -12 ;;
    fp8nano) for c in ${FP8_CONFIGS:-bf16 w8 kv8}; do
               f=""; case $c in w8) f="--quantization fp8";; kv8) f="--kv-cache-dtype fp8";;
                 w8kv8) f="--quantization fp8 --kv-cache-dtype fp8";; esac
               here timeout 240 $BENCH --model qwen3-8b --workload nano --repeat 3 $f --json-out "$R/q8b_nano_$c.json" \
                 2>&1 | tail -6; save; done ;;
    fp8one) for c in bf16 w8; do
              f=""; [ $c = w8 ] && f="--quantization fp8"
              here timeout 200 $BENCH --model qwen3-8b --workload one-request --repeat 3 $f \
                --json-out "$R/q8b_one_$c.json" 2>&1 | tail -6; save; done ;;
    tp) here timeout 560 python3 benchmarks/engine/tp_scaling.py --size-timeout 240 --model qwen3-8b --tp ${TP_SIZES:-1 2} \
          --json-out "$R/tp_8b.json" 2>&1 | grep -v "^{" | tail -12 ;;
    *) echo "unknown section $s" ;;
  esac
  save
done
here python3 benchmarks/gpu_machine/gpu_summary.py "$R"
