#!/usr/bin/env bash
# The GPU suite and the benchmarks in one call, with a short table printed last.
#   bash scripts/gpu_check.sh [SECTION ...]
# sections: tests fp8kv bench06 bench8b ab fusedab latency hf hf8b profile profile8b sampler kernels serve serve8b
#           tptests tpdebug pynccl car gemv tpab tpgemv tpsimple tpgpu tpfp8 tpprofile tp tp32 topo tp4
#   topo: nvidia-smi topo -m (how the GPUs are linked)
#   tpfusednorm: Qwen3-8B at TP=2 with MINIVLLM_FUSED_AR_NORM=1 (all-reduce + add + RMSNorm in one kernel)
#   pdltests: the PDL GPU tests (decode kernels, engine), the custom all-reduce's; TP=2 with PDL / fused norm / sharded sampling
#   pdlbench: bench_pdl.py (36 layers of decode kernels in a graph, PDL off / on)
#   arnorm: bench_all_reduce.py --fused-norm (all-reduce + add + RMSNorm: two kernels vs fused), PDL off and on
#   attn: decode attention at TP=2 shapes of Qwen3-8B (16/4 heads): unified-kernel tile configurations, split-KV
#   archeck: bench_all_reduce.py (plain and --fused-norm) with the abort flag read every 1024 and every 16 polls
#   repeat: $REPEAT_TEST (a pytest node id or path with -k) $REPEAT_N times (default 10); keeps the logs of failing runs
#   lazy: benchmarks/lazy_compiles.py on $LAZY_MODELS (default qwen3-0.6b): kernels compiled after start-up, first vs
#         second pass of small scenarios, with a fresh Triton cache; $LAZY_ARGS adds arguments, e.g.
#         LAZY_ARGS="--engine-arg tensor_parallel_size=2"
#   ltab: Qwen3-8B nano ($LTAB_REPEAT runs, default 2) with the defaults, then with cuBLASLt for the 17-$LT_MAX_ROWS-row
#         decode graphs (MINIVLLM_CUBLASLT_MAX_ROWS, default 128), and its GPU test
#   ceoverlap: bench_ce_overlap.py (2 GPUs): copy-engine all-reduce of prefill partials, alone and overlapping the
#              row-parallel matmuls in $CE_CHUNKS slices (default "1 4 8"); then NCCL alone at 128 MB
#   proxy: the nano workload on $PROXY_MODELS (default qwen3-8b-tp2-rank: one rank's shapes of Qwen3-8B at TP=2, on one GPU),
#          $PROXY_REPEAT runs (default 2); var_<model>_base$PROXY_TAG.json
#   proxyprofile: profile_step.py decode steps of $PROXY_ROWS rows on $PROXY_MODEL (default qwen3-8b-tp2-rank)
#   attnmid: decode attention at 16-128 rows ($ATTN_HEADS, default TP=2 shapes of Qwen3-8B), unified vs split-KV factors
#   fusab: the K/V store fused into the q/k norm + RoPE kernel: the GPU tests it touches, bench_fused_kv_store.py, then
#          one-request ($FUSAB_MODELS) and nano ($FUSAB_NANO) with MINIVLLM_FUSED_KV_STORE=0 (or $FUSAB_OFF), then
#          with the defaults; FUSAB_TESTS picks the tests, FUSAB_NO_TESTS=1 / FUSAB_NO_BENCH=1 skip them / bench_fused_kv_store
#   decodeoverlap: bench_decode_overlap.py (2 GPUs): decode-sized row-parallel matmuls whose custom all-reduce runs
#                  slice by slice on a side stream under the next slice's matmul ($DECODE_OVERLAP_ARGS)
#   sessiontests: the TP, PDL and custom all-reduce GPU tests
#   nanovar: $VAR_WORKLOAD (default nano) on each of $VAR_MODELS (default qwen3-8b) once per entry of $VARIANTS
#            ("name:VAR=value,VAR2=value"; name: alone = defaults), $VAR_REPEAT runs each (default 2); var_<model>_<name>.json
#   tpvar: Qwen3-8B at TP=2 once per entry of $TP_VARIANTS, "name:VAR=value,VAR2=value" (name: alone = defaults),
#          e.g. TP_VARIANTS="base: simple:NCCL_PROTO=Simple"; results in tp_8b_<name>.json
#   arsweep: bench_all_reduce.py over the kernel shapes in $AR_CONFIGS (PROGRAMSxBLOCKxWARPS), the fused norm at
#            $MINIVLLM_CUSTOM_AR_PROGRAMS-style program counts in $NORM_PROGRAMS, and NCCL alone at 16-128 MB with
#            each NCCL setting in $NCCL_VARIANTS ("name:VAR=value,...")
#   tpbase: Qwen3-8B at TP=2 with PDL and the fused all-reduce + norm off (the defaults before 2026-11-23)
#   tpshard: Qwen3-8B at TP=2 with MINIVLLM_TP_SHARDED_SAMPLING=1 (each rank samples its vocabulary slice)
#   tppdl / tppdlnorm: Qwen3-8B at TP=2 with MINIVLLM_PDL=1 (and MINIVLLM_FUSED_AR_NORM=1)
#   tpwaits: Qwen3-8B at TP=2 with MINIVLLM_CUSTOM_AR_WAITS (each rank prints how long its all-reduces waited)
#   tp4: on 4 GPUs, the custom all-reduce's and the TP GPU tests (TP=4 included), then all-reduce latency at 4 ranks
#   car: the custom all-reduce's GPU test, then its latency against NCCL (bench_all_reduce.py, $AR_CONFIGS)
#   gemv: the Triton GEMV's GPU tests, then its speed against cuBLAS (bench_gemv.py: $GEMV_ROWS, $GEMV_CONFIGS,
#         $GEMV_MODELS, $GEMV_TPS; every config's time in gemv_all.txt)
#   tpab: Qwen3-8B at TP=2 with the custom all-reduce off (NCCL only), to compare with tp
#   prefetch: bench_prefetch.py ($PREFETCH_ARGS): GEMMs after a window of latency-bound work, with and without an
#             L2 prefetch of their weight on a side stream
#   tpgemv: Qwen3-8B at TP=2 with the Triton GEMV off (cuBLAS only), to compare with tp
#   tpsimple: Qwen3-8B at TP=2 with NCCL_PROTO=Simple (the prefill all-reduces ran NCCL's LL protocol)
#   tpgpu: the GPU tests of this session's TP work (custom all-reduce, GEMV, pynccl, TP, engine)
#   tpfp8: Qwen3-8B at TP=2 with an FP8 KV cache
#   tpprofile: profile_step.py on Qwen3-8B at TP=2 (host phases, rank 0's kernels)
#   fp8kv: the nano workloads with an FP8 (e4m3) KV cache
#   fusedab: the fused sampler off (nano x3), to compare with bench06
#   ab: asynchronous scheduling off (0.6B one request x3, nano x1), to compare with bench06
#   tp / tp32: tp_scaling.py on Qwen3-8B / Qwen3-32B at the sizes in $TP_SIZES (default "1 2"), plus $TP_ARGS, e.g.
#              TP_ARGS=--rank-proxy TP_TAIL=24 (each TP size's extra time over one rank's compute, by step kind)
#   tpdebug: the ctypes NCCL communicator's test, then the TP GPU tests (set MINIVLLM_TP_COMM to choose)
# Results (JSON, logs, plots) go to /tmp/gpu_check; with $OUT set (the device tool), also as $OUT/results.tgz.
# NOTE: the device tool brings back at most 8 files from $OUT: leave results.tgz there rather than copies of each file.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
R=/tmp/gpu_check
mkdir -p "$R"
sections=${*:-tests bench06 bench8b hf profile}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$R/device.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$R/device.txt"
echo "commit ${MINIVLLM_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}" | tee -a "$R/device.txt"
BENCH="python3 -m minivllm.entrypoints.bench throughput"  # NOTE: `timeout` cannot run a shell function
# NOTE: every section has a time limit and the results are archived after each one, so a section
# that hangs cannot take the others' results with it.
save() { [ -n "${OUT:-}" ] && tar czf "$OUT/results.tgz" -C "$R" . ; true; }
# nano_variants MODELS VARIANTS REPEAT [WORKLOAD]: the workload on each model once per "name:VAR=value,..." variant
nano_variants() {
  for M in $1; do for v in $2; do name=${v%%:*}; vars=${v#*:}
    echo "== $M $name: ${vars:-defaults}"
    env ${vars//,/ } timeout 240 $BENCH --model $M --workload ${4:-nano} --repeat $3 --json-out "$R/var_${M}_$name.json" 2>&1 \
      | grep -iE "tok/s|ms/token|error" | tail -3; save; done; done
}
for s in $sections; do
  case $s in
    tests) timeout 420 python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider > "$R/gpu_tests.log" 2>&1; tail -15 "$R/gpu_tests.log" ;;
    bench06)
      for w in nano fixed-batch one-request; do timeout 150 $BENCH --model qwen3-0.6b --workload $w --repeat 3 --json-out "$R/q06_$w.json" 2>&1 | tail -16; done ;;
    bench8b)
      for w in nano one-request; do timeout 200 $BENCH --model qwen3-8b --workload $w --repeat 3 --json-out "$R/q8b_$w.json" 2>&1 | tail -16; done ;;
    ab)
      timeout 100 $BENCH --model qwen3-0.6b --workload one-request --repeat 3 --no-async-scheduling --json-out "$R/q06_one-request_sync.json" 2>&1 | tail -8
      timeout 100 $BENCH --model qwen3-0.6b --workload nano --repeat 1 --no-async-scheduling --json-out "$R/q06_nano_sync.json" 2>&1 | tail -8 ;;
    latency)
      for M in qwen3-0.6b qwen3-8b; do timeout 150 python3 -m minivllm.entrypoints.bench latency --model $M --batch-size 8 --input-len 128 --output-len 128 --num-iters 3 --json-out "$R/${M}_latency.json" 2>&1 | tail -12; done ;;
    hf) timeout 150 python3 benchmarks/hf_baseline.py --model qwen3-0.6b --json-out "$R/q06_hf_fixed.json" 2>&1 | tail -8 ;;
    hf8b) timeout 300 python3 benchmarks/hf_baseline.py --model qwen3-8b --json-out "$R/q8b_hf_fixed.json" 2>&1 | tail -8 ;;
    profile) timeout 200 python3 benchmarks/profile_step.py --model benchmarks/configs/qwen3-0.6b > "$R/profile.txt" 2>&1;
             grep -A12 "^## " "$R/profile.txt" | grep -v "^--$" | head -40 ;;
    profile8b) timeout 240 python3 benchmarks/profile_step.py --model benchmarks/configs/qwen3-8b > "$R/profile_8b.txt" 2>&1;
               grep -A12 "^## " "$R/profile_8b.txt" | grep -v "^--$" | head -40 ;;
    sampler) timeout 90 python3 benchmarks/bench_sampler.py > "$R/sampler.txt" 2>&1; tail -12 "$R/sampler.txt"
             timeout 90 python3 benchmarks/bench_sampler.py --fused > "$R/sampler_fused.txt" 2>&1; tail -12 "$R/sampler_fused.txt" ;;
    fp8kv)
      for w in nano; do timeout 150 $BENCH --model qwen3-0.6b --workload $w --repeat 3 --kv-cache-dtype fp8 --json-out "$R/q06_${w}_fp8kv.json" 2>&1 | tail -8; done
      timeout 200 $BENCH --model qwen3-8b --workload nano --repeat 3 --kv-cache-dtype fp8 --json-out "$R/q8b_nano_fp8kv.json" 2>&1 | tail -8 ;;
    fusedab) MINIVLLM_FUSED_SAMPLER=0 timeout 150 $BENCH --model qwen3-0.6b --workload nano --repeat 3 --json-out "$R/q06_nano_unfused.json" 2>&1 | tail -8 ;;
    kernels) timeout 200 python3 benchmarks/bench_kernels.py > "$R/kernels.txt" 2>&1; tail -25 "$R/kernels.txt" ;;
    tptests) timeout 300 python3 -m pytest -m gpu tests/gpu/test_tp_gpu.py -q -p no:cacheprovider > "$R/tp_tests.log" 2>&1; tail -8 "$R/tp_tests.log" ;;
    tpdebug) NCCL_DEBUG=WARN MINIVLLM_HANG_DUMP_S=45 timeout 200 python3 -m pytest -q -s -p no:cacheprovider -rA \
               tests/gpu/test_tp_gpu.py -o faulthandler_timeout=60 > "$R/tp_debug.log" 2>&1
             grep -v "^frame" "$R/tp_debug.log" | tail -40; nvidia-smi --query-compute-apps=pid,used_memory --format=csv ;;
    pynccl) timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_pynccl_gpu.py > "$R/pynccl.log" 2>&1; tail -5 "$R/pynccl.log" ;;
    car) timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_custom_all_reduce_gpu.py > "$R/car.log" 2>&1; tail -5 "$R/car.log"
         timeout 150 python3 benchmarks/bench_all_reduce.py --world 2 ${AR_CONFIGS:+--configs $AR_CONFIGS} --json-out "$R/all_reduce.json" 2>&1 | tail -12 ;;
    gemv) timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemv_gpu.py > "$R/gemv.log" 2>&1; tail -3 "$R/gemv.log"
          timeout ${GEMV_TIMEOUT:-200} python3 benchmarks/bench_gemv.py --rows ${GEMV_ROWS:-1} --models ${GEMV_MODELS:-8b 32b 0.6b} \
            ${GEMV_TPS:+--tps $GEMV_TPS} ${GEMV_CONFIGS:+--configs $GEMV_CONFIGS} ${GEMV_LT:+--cublaslt} --all-out "$R/gemv_all.txt" > "$R/gemv_bench.txt" 2>&1
          grep -v "^  " "$R/gemv_bench.txt" | tail -${GEMV_TAIL:-40} ;;
    tpsimple) NCCL_PROTO=Simple timeout 200 python3 benchmarks/tp_scaling.py --size-timeout 180 --model benchmarks/configs/qwen3-8b --tp 2 --json-out "$R/tp_8b_nccl_simple.json" 2>&1 | tail -4 ;;
    tpgpu) timeout 420 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_custom_all_reduce_gpu.py tests/gpu/test_gemv_gpu.py \
             tests/gpu/test_pynccl_gpu.py tests/gpu/test_tp_gpu.py tests/gpu/test_engine_gpu.py > "$R/tp_gpu_tests.log" 2>&1; tail -6 "$R/tp_gpu_tests.log" ;;
    prefetch) timeout ${PREFETCH_TIMEOUT:-300} python3 benchmarks/bench_prefetch.py ${PREFETCH_ARGS:-} > "$R/prefetch.txt" 2>&1
              tail -${PREFETCH_TAIL:-60} "$R/prefetch.txt" ;;
    tpgemv) MINIVLLM_GEMV=0 timeout 200 python3 benchmarks/tp_scaling.py --size-timeout 180 --model benchmarks/configs/qwen3-8b --tp 2 --json-out "$R/tp_8b_cublas.json" 2>&1 | tail -4 ;;
    tpab) MINIVLLM_CUSTOM_AR=0 timeout 200 python3 benchmarks/tp_scaling.py --size-timeout 180 --model benchmarks/configs/qwen3-8b --tp 2 --json-out "$R/tp_8b_nccl_only.json" 2>&1 | tail -4 ;;
    tpfp8) timeout 200 python3 benchmarks/tp_scaling.py --size-timeout 180 --model benchmarks/configs/qwen3-8b --tp 2 --kv-cache-dtype fp8 --json-out "$R/tp_8b_fp8kv.json" 2>&1 | tail -4 ;;
    tpprofile) timeout 240 python3 benchmarks/profile_step.py --model benchmarks/configs/qwen3-8b --tp 2 > "$R/tp_profile_8b.txt" 2>&1;
               grep -A12 "^## " "$R/tp_profile_8b.txt" | grep -v "^--$" | head -40 ;;
    tp) timeout 560 python3 benchmarks/tp_scaling.py --size-timeout 240 --model benchmarks/configs/qwen3-8b --tp ${TP_SIZES:-1 2} ${TP_ARGS:-} --json-out "$R/tp_8b.json" 2>&1 | grep -v "^{" | tail -${TP_TAIL:-12} ;;
    tp32) timeout 560 python3 benchmarks/tp_scaling.py --size-timeout ${SIZE_TIMEOUT:-270} --model benchmarks/configs/qwen3-32b --tp ${TP_SIZES:-1 2} ${TP_ARGS:-} --json-out "$R/tp_32b.json" 2>&1 | grep -v "^{" | tail -${TP_TAIL:-12} ;;
    serve) timeout 300 bash scripts/serve_bench.sh "$R" 2>&1 | tail -60 ;;
    serve8b) timeout 400 bash scripts/serve_bench.sh "$R" qwen3-8b 2>&1 | tail -60 ;;
    lazy) for M in ${LAZY_MODELS:-qwen3-0.6b}; do timeout ${LAZY_TIMEOUT:-300} python3 benchmarks/lazy_compiles.py --model benchmarks/configs/$M \
            ${LAZY_ARGS:-} --json-out "$R/lazy_$M.json" > "$R/lazy_$M.txt" 2>&1; grep -v "^  \[" "$R/lazy_$M.txt" | tail -14; done ;;
    ltab) timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_engine_gpu.py -k cublaslt > "$R/ltab_test.log" 2>&1; tail -3 "$R/ltab_test.log"
          timeout 200 $BENCH --model qwen3-8b --workload nano --repeat ${LTAB_REPEAT:-2} --json-out "$R/q8b_nano_ltbase.json" 2>&1 | grep -i "tok/s" | tail -3
          MINIVLLM_CUBLASLT_MAX_ROWS=${LT_MAX_ROWS:-128} timeout 200 $BENCH --model qwen3-8b --workload nano --repeat ${LTAB_REPEAT:-2} \
            --json-out "$R/q8b_nano_lt.json" 2>&1 | grep -i "tok/s" | tail -3 ;;
    ceoverlap) timeout 200 python3 benchmarks/bench_ce_overlap.py --chunks ${CE_CHUNKS:-1 4 8} > "$R/ce_overlap.txt" 2>&1; tail -12 "$R/ce_overlap.txt"
               timeout 120 python3 benchmarks/bench_all_reduce.py --world 2 --nccl-mb 128 --json-out "$R/nccl_128.json" 2>&1 | tail -4 ;;
    decodeoverlap) timeout 300 python3 benchmarks/bench_decode_overlap.py ${DECODE_OVERLAP_ARGS:-} --json-out "$R/decode_overlap.json" \
                     > "$R/decode_overlap.txt" 2>&1; tail -9 "$R/decode_overlap.txt" ;;
    topo) nvidia-smi topo -m | tee "$R/topo.txt" ;;
    tpfusednorm) MINIVLLM_FUSED_AR_NORM=1 timeout 200 python3 benchmarks/tp_scaling.py --size-timeout 180 \
                   --model benchmarks/configs/qwen3-8b --tp 2 --json-out "$R/tp_8b_fused_norm.json" 2>&1 | tail -4 ;;
    tpwaits) MINIVLLM_CUSTOM_AR_WAITS=40000 timeout 200 python3 benchmarks/tp_scaling.py --size-timeout 180 \
               --model benchmarks/configs/qwen3-8b --tp 2 --json-out "$R/tp_8b_waits.json" > "$R/tp_waits.txt" 2>&1
             grep -E "custom all-reduce|^ +2 " "$R/tp_waits.txt" ;;
    tp4) timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_custom_all_reduce_gpu.py tests/gpu/test_tp_gpu.py \
           > "$R/tp4_tests.log" 2>&1; tail -6 "$R/tp4_tests.log"
         timeout 150 python3 benchmarks/bench_all_reduce.py --world 4 ${AR_CONFIGS:+--configs $AR_CONFIGS} --json-out "$R/all_reduce_w4.json" 2>&1 | tail -12 ;;
    pdltests) timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_pdl_gpu.py tests/gpu/test_custom_all_reduce_gpu.py \
                > "$R/pdl_tests.log" 2>&1; tail -4 "$R/pdl_tests.log"
              timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_tp_gpu.py \
                -k "(pdl_and_fused or fused_all_reduce_norm or sharded) and not untied" > "$R/tp_new_tests.log" 2>&1
              tail -4 "$R/tp_new_tests.log" ;;
    proxy) nano_variants "${PROXY_MODELS:-qwen3-8b-tp2-rank}" "base${PROXY_TAG:-}:" "${PROXY_REPEAT:-2}" ;;
    proxyprofile) timeout 240 python3 benchmarks/profile_step.py --model benchmarks/configs/${PROXY_MODEL:-qwen3-8b-tp2-rank} \
                    --decode-rows ${PROXY_ROWS:-1 48 112 240} --decode-context 1000 > "$R/proxy_profile${PROXY_TAG:-}.txt" 2>&1
                  grep -E "^## decode|wall" "$R/proxy_profile${PROXY_TAG:-}.txt" | head -20 ;;
    attnmid) timeout 200 python3 benchmarks/bench_kernels.py --cuda-graph --heads ${ATTN_HEADS:-16 4 128} --block-sizes 256 \
               --batches 16 32 48 64 96 128 --contexts 512 1024 --sweep-splits 2 3 4 6 8 > "$R/attn_mid.txt" 2>&1; tail -14 "$R/attn_mid.txt" ;;
    fusab) [ -z "${FUSAB_NO_TESTS:-}" ] && timeout 300 python3 -m pytest -q -p no:cacheprovider ${FUSAB_TESTS:-tests/gpu/test_fused_kernels_gpu.py \
             tests/gpu/test_engine_gpu.py tests/gpu/test_fp8_kv_gpu.py} > "$R/fus_tests.log" 2>&1; tail -3 "$R/fus_tests.log"
           [ -z "${FUSAB_NO_BENCH:-}" ] && timeout 120 python3 benchmarks/bench_fused_kv_store.py > "$R/fusions.txt" 2>&1 && tail -22 "$R/fusions.txt"
           OFF=${FUSAB_OFF:-MINIVLLM_FUSED_KV_STORE=0}
           for M in ${FUSAB_MODELS:-qwen3-0.6b qwen3-8b}; do for v in off on; do
             env $([ $v = off ] && echo $OFF) timeout 150 $BENCH --model $M --workload one-request --repeat 3 \
               --json-out "$R/one_${M}_$v.json" > "$R/one_${M}_$v.log" 2>&1; done; done
           for M in ${FUSAB_NANO-qwen3-8b-tp2-rank qwen3-8b}; do for v in off on; do
             env $([ $v = off ] && echo $OFF) timeout 150 $BENCH --model $M --workload nano --repeat 2 \
               --json-out "$R/nano_${M}_$v.json" > "$R/nano_${M}_$v.log" 2>&1; done; done
           python3 -c "
import glob, json, os
for f in sorted(glob.glob('$R/one_*_o*.json') + glob.glob('$R/nano_*_o*.json')):
    d = json.load(open(f)); runs = d.get('runs', [])
    key = 'ms_per_token' if os.path.basename(f).startswith('one_') else 'output_tok_s'
    print(f'{os.path.basename(f):<40} {key} {d[key]:.4g}  runs', ', '.join(f'{r[key]:.4g}' for r in runs))" ;;
    attn) timeout 200 python3 benchmarks/bench_kernels.py --cuda-graph --heads 16 4 128 --block-sizes 256 --batches 64 256 \
            --contexts 512 1024 2048 --configs 64x2x4 64x3x4 64x4x4 32x3x4 32x4x4 128x2x4 128x3x8 64x3x8 > "$R/attn_configs.txt" 2>&1
          tail -9 "$R/attn_configs.txt"
          timeout 120 python3 benchmarks/bench_kernels.py --cuda-graph --heads 16 4 128 --block-sizes 256 --batches 64 256 \
            --contexts 512 1024 2048 --sweep-splits 2 4 8 > "$R/attn_splits.txt" 2>&1; tail -9 "$R/attn_splits.txt" ;;
    archeck) for c in ${CHECKS:-1024 16}; do
               MINIVLLM_CUSTOM_AR_CHECK_EVERY=$c timeout 100 python3 benchmarks/bench_all_reduce.py --world 2 \
                 --json-out "$R/all_reduce_check$c.json" 2>&1 | tail -9
               MINIVLLM_CUSTOM_AR_CHECK_EVERY=$c timeout 100 python3 benchmarks/bench_all_reduce.py --world 2 --fused-norm \
                 --rows 1 8 64 256 512 --tile-rows 0 1 2 4 --json-out "$R/ar_norm_check$c.json" 2>&1 | tail -7; done ;;
    tpbase) MINIVLLM_PDL=0 MINIVLLM_FUSED_AR_NORM=0 timeout 200 python3 benchmarks/tp_scaling.py --size-timeout 150 \
              --model benchmarks/configs/qwen3-8b --tp 2 --json-out "$R/tp_8b_base.json" 2>&1 | tail -4 ;;
    tpshard) MINIVLLM_TP_SHARDED_SAMPLING=1 timeout 200 python3 benchmarks/tp_scaling.py --size-timeout 150 \
               --model benchmarks/configs/qwen3-8b --tp 2 --json-out "$R/tp_8b_sharded.json" 2>&1 | tail -4 ;;
    pdlbench) timeout 200 python3 benchmarks/bench_pdl.py --json-out "$R/pdl_bench.json" 2>&1 | tail -6 ;;
    arnorm) for p in 0 1; do MINIVLLM_PDL=$p timeout 120 python3 benchmarks/bench_all_reduce.py --world 2 --fused-norm \
              --rows 1 8 64 128 256 512 1024 --json-out "$R/ar_norm_pdl$p.json" 2>&1 | tail -10; done ;;
    tppdl) MINIVLLM_PDL=1 timeout 200 python3 benchmarks/tp_scaling.py --size-timeout 150 --model benchmarks/configs/qwen3-8b \
             --tp 2 --json-out "$R/tp_8b_pdl.json" 2>&1 | tail -4 ;;
    tppdlnorm) MINIVLLM_PDL=1 MINIVLLM_FUSED_AR_NORM=1 timeout 200 python3 benchmarks/tp_scaling.py --size-timeout 150 \
                 --model benchmarks/configs/qwen3-8b --tp 2 --json-out "$R/tp_8b_pdl_fused_norm.json" 2>&1 | tail -4 ;;
    repeat) pass=0; fail=0; for i in $(seq 1 ${REPEAT_N:-10}); do
              if timeout ${REPEAT_TIMEOUT:-120} python3 -m pytest -q -p no:cacheprovider ${REPEAT_TEST:?set REPEAT_TEST} \
                   > "$R/repeat_$i.log" 2>&1; then pass=$((pass + 1)); rm -f "$R/repeat_$i.log"
              else fail=$((fail + 1)); grep -E "^E |FAILED" "$R/repeat_$i.log" | head -20; fi; done
            echo "repeat: $pass passed, $fail failed of ${REPEAT_N:-10} runs of $REPEAT_TEST (failing logs: $R/repeat_N.log)" ;;
    sessiontests) timeout 330 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_tp_gpu.py tests/gpu/test_pdl_gpu.py \
                    tests/gpu/test_custom_all_reduce_gpu.py > "$R/session_tests.log" 2>&1; tail -4 "$R/session_tests.log" ;;
    tpvar) for v in ${TP_VARIANTS:-base:}; do name=${v%%:*}; vars=${v#*:}; echo "== tp variant $name: ${vars:-defaults}"
             env ${vars//,/ } timeout 200 python3 benchmarks/tp_scaling.py --size-timeout 150 --model benchmarks/configs/qwen3-8b \
               --tp 2 --json-out "$R/tp_8b_$name.json" 2>&1 | tail -3; save; done ;;
    nanovar) nano_variants "${VAR_MODELS:-qwen3-8b}" "${VARIANTS:-base:}" "${VAR_REPEAT:-2}" "${VAR_WORKLOAD:-nano}" ;;
    arsweep) timeout 150 python3 benchmarks/bench_all_reduce.py --world 2 --configs ${AR_CONFIGS:-64x2048x8 128x2048x8 256x2048x8} \
               --json-out "$R/all_reduce_sweep.json" 2>&1 | tail -10
             for p in ${NORM_PROGRAMS:-64 128 256}; do MINIVLLM_CUSTOM_AR_PROGRAMS=$p timeout 100 python3 benchmarks/bench_all_reduce.py \
               --world 2 --fused-norm --rows 1 8 64 128 256 512 --tile-rows 0 --json-out "$R/ar_norm_p$p.json" 2>&1 | tail -7; done
             for v in ${NCCL_VARIANTS:-default:}; do name=${v%%:*}; vars=${v#*:}
               env ${vars//,/ } timeout 100 python3 benchmarks/bench_all_reduce.py --world 2 --nccl-mb 16 32 64 128 \
                 --json-out "$R/nccl_$name.json" 2>&1 | tail -6; done ;;
    *) echo "unknown section $s" ;;
  esac
  save
done
python3 scripts/gpu_summary.py "$R"
