"""GPU engine checks: CUDA graphs vs eager, GPU vs CPU, bf16 vs transformers on the demo model."""

import os

import pytest
import torch

from minivllm import LLM, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
PROMPTS = [f"def function_{i}(x):\n    return " + "x + " * i for i in range(40)]
DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "models", "minivllm-demo-py")


def ids(outs):
    return [o["token_ids"] for o in outs]


def test_cuda_graphs_equal_eager_float32(tiny_model):
    kw = dict(device="cuda", dtype="float32", max_num_seqs=48, gpu_memory_utilization=0.3)
    eager = LLM(tiny_model, enforce_eager=True, **kw)
    expected = ids(eager.generate(PROMPTS, GREEDY, use_tqdm=False))
    eager.close()
    graphs = LLM(tiny_model, **kw)
    assert graphs.engine.executor.runner.graph_runner is not None
    # 40 prompts decode at batch sizes from 40 down: replays padded graphs of several sizes
    assert ids(graphs.generate(PROMPTS, GREEDY, use_tqdm=False)) == expected
    assert ids(graphs.generate(PROMPTS[:3], GREEDY, use_tqdm=False)) == expected[:3]


def test_async_scheduling_equals_sync_float32(tiny_model):
    """The async lever on and off: the same tokens (greedy, seeded sampling, stop ids), graphs on."""
    kw = dict(device="cuda", dtype="float32", max_num_seqs=48, gpu_memory_utilization=0.3)
    sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=32, ignore_eos=True)
    fused = SamplingParams(temperature=0.8, seed=9, max_tokens=32, ignore_eos=True)  # no filters (Gumbel-max if on)
    sync = LLM(tiny_model, async_scheduling=False, **kw)
    greedy = ids(sync.generate(PROMPTS, GREEDY, use_tqdm=False))
    stop = [SamplingParams(temperature=0, max_tokens=32, stop_token_ids=[g[5 + i % 20]]) for i, g in enumerate(greedy)]
    expected = [ids(sync.generate(PROMPTS, p, use_tqdm=False)) for p in (sampled, stop, fused)]
    sync.close()
    asyn = LLM(tiny_model, async_scheduling=True, **kw)
    assert asyn.engine.executor.runner.graph_runner is not None
    assert ids(asyn.generate(PROMPTS, GREEDY, use_tqdm=False)) == greedy
    assert [ids(asyn.generate(PROMPTS, p, use_tqdm=False)) for p in (sampled, stop, fused)] == expected
    assert all(len(t) < 32 for t in expected[1])  # every request stopped early on its stop id
    assert asyn.engine.block_manager.num_used_blocks == 0


def test_gpu_equals_cpu_first_tokens(tiny_model):
    cpu = ids(LLM(tiny_model, device="cpu").generate(PROMPTS[:12], GREEDY, use_tqdm=False))
    gpu = ids(LLM(tiny_model, device="cuda", dtype="float32", gpu_memory_utilization=0.3)
              .generate(PROMPTS[:12], GREEDY, use_tqdm=False))
    # float32 on both; TF32 is off by default for matmuls, so the first tokens must agree
    assert [g[:8] for g in gpu] == [c[:8] for c in cpu]
    agree = sum(g == c for g, c in zip(gpu, cpu))
    assert agree >= 10, f"only {agree}/12 full sequences agree"


def test_chunked_prefill_and_preemption_on_gpu(tiny_tied_model):
    kw = dict(device="cuda", dtype="float32", gpu_memory_utilization=0.3)
    expected = ids(LLM(tiny_tied_model, **kw).generate(PROMPTS, GREEDY, use_tqdm=False))
    tight = LLM(tiny_tied_model, max_num_batched_tokens=64, num_kvcache_blocks=64, max_model_len=512, **kw)
    assert ids(tight.generate(PROMPTS, GREEDY, use_tqdm=False)) == expected


@pytest.mark.skipif(not os.path.isdir(DEMO), reason="demo model not in the repo")
def test_demo_model_bf16_cuda_graphs_matches_transformers():
    from tests.helpers.demo_compare import PROMPTS, compare_with_transformers

    llm = LLM(DEMO, dtype="bfloat16", gpu_memory_utilization=0.3)
    assert llm.engine.executor.runner.graph_runner is not None  # decode steps replay CUDA graphs
    outs = ids(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    llm.close()
    matches, bad = compare_with_transformers(DEMO, outs, "cuda")
    print(f"demo model bf16 + CUDA graphs: {matches}/{len(PROMPTS)} prompts equal transformers for 32 tokens")
    assert not bad, f"divergences that are not bf16 near-ties in transformers' logits: {bad}"
    assert matches >= 8


def test_cublaslt_decode_graphs(tiny_model):
    """Decode graphs of 17..128 rows (``CUBLASLT_ROWS``; here 32 and 48) capture cuBLASLt GEMMs (the backend is
    switched only inside the scope), and greedy tokens equal eager ones (float32)."""
    from minivllm.worker.cuda_graphs import CUBLASLT_ROWS, blas_for_rows, graph_batch_sizes

    before = torch.backends.cuda.preferred_blas_library()
    with blas_for_rows(32):
        assert torch.backends.cuda.preferred_blas_library() == torch._C._BlasBackend.Cublaslt
    assert torch.backends.cuda.preferred_blas_library() == before
    assert [s for s in graph_batch_sizes(48) if s in CUBLASLT_ROWS] == [32, 48]
    kw = dict(device="cuda", dtype="float32", max_num_seqs=48, gpu_memory_utilization=0.3)
    with LLM(tiny_model, enforce_eager=True, **kw) as eager:
        expected = ids(eager.generate(PROMPTS, GREEDY, use_tqdm=False))
    with LLM(tiny_model, **kw) as graphs:
        assert ids(graphs.generate(PROMPTS, GREEDY, use_tqdm=False)) == expected
    assert torch.backends.cuda.preferred_blas_library() == before


LAZY_COMPILES = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "engine",
                             "lazy_compiles.py")


@pytest.mark.skipif(not os.path.isfile(LAZY_COMPILES),
                    reason="benchmarks/engine/lazy_compiles.py is not in the repo")
def test_no_triton_compiles_after_start_up(tiny_model, tmp_path):
    """``benchmarks/engine/lazy_compiles.py`` in a fresh process and Triton cache: start-up compiles every kernel
    that greedy, temperature, top-k/top-p, logprobs, prefix-hit and chunked-prefill requests use (bf16)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "lazy.json"
    proc = subprocess.run(
        [sys.executable, LAZY_COMPILES, "--model", tiny_model,
         "--engine-arg", "max_model_len=1024", "--engine-arg", "max_num_batched_tokens=512",
         "--engine-arg", "dtype=bfloat16", "--json-out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert len(result["scenarios"]) == 9
    assert result["lazy_compiles"] == 0, proc.stdout[-3000:]
    assert result["late_cache_kernels"] == [], proc.stdout[-3000:]
