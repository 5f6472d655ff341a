"""Sliding-window attention on a real GPU: the Triton prefill / chunked-prefill and decode kernels (unified and
split-KV; their CUDA-graph replay is in ``test_kernels_gpu.py``) against the torch reference with the same
window, and a tiny Mistral through the engine (CUDA graphs, eager, the CPU's torch backend: the same greedy
tokens).

Windows: Mistral-7B's 4096 over contexts past it, and short ones (under a block, a few blocks)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.gpu.test_kernels_gpu import MAX_REL_ERR, make_batch, ref_attention, rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

if torch.cuda.is_available():
    from minivllm.kernels.paged_attention import paged_attention
    from minivllm.kernels.paged_decode import paged_decode, paged_decode_split_kv

WINDOWS = [7, 100, 1000, 4096]


def windowed_rows(seed: int) -> list[tuple[int, int]]:
    """Decode rows with contexts up to ~6k (past a 4096 window) and prefill chunks with and without a prefix."""
    rng = random.Random(seed)
    rows = [(1, rng.randint(1, 6000)) for _ in range(6)] + [(1, 1), (0, 0), (1, 4097)]
    rows += [(512, 5000), (300, 300), (64, rng.randint(64, 2000)), (rng.randint(2, 200), 4500), (129, 129)]
    rng.shuffle(rows)
    return rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("window", WINDOWS)
def test_paged_attention_window_gpu(window, block_size, dtype):
    rows = windowed_rows(seed=window + block_size)
    q, kc, vc, cu, ctx, bt = make_batch(rows, 8, 2, 128, block_size, dtype, seed=window)
    ref = ref_attention(q, kc, vc, cu, ctx, bt, 128**-0.5, window)
    out = torch.full_like(q, float("nan"))
    paged_attention(q, kc, vc, cu, ctx, bt, 128**-0.5, max(r[0] for r in rows), max(r[1] for r in rows), out=out,
                    sliding_window=window)
    assert rel_err(out, ref) < MAX_REL_ERR


@pytest.mark.parametrize("num_splits", [None, 1, 3, 16])
@pytest.mark.parametrize("window", WINDOWS)
def test_decode_window_gpu(window, num_splits):
    rng = random.Random(window)
    rows = [(1, rng.randint(1, 8192)) for _ in range(5)] + [(1, 1), (1, 8192), (1, window + 1)]
    q, kc, vc, cu, ctx, bt = make_batch(rows, 32, 8, 128, 16, torch.bfloat16, seed=1)
    ref = ref_attention(q, kc, vc, cu, ctx, bt, 0.1, window)
    out = torch.full_like(q, float("nan"))
    if num_splits is None:
        paged_decode(q, kc, vc, ctx, bt, 0.1, 8192, out=out, sliding_window=window)
    else:
        paged_decode_split_kv(q, kc, vc, ctx, bt, 0.1, 8192, num_splits=num_splits, out=out, sliding_window=window)
    assert rel_err(out, ref) < MAX_REL_ERR


@pytest.fixture(scope="module")
def tiny_mistral(tmp_path_factory) -> str:
    from tests.helpers.mistral_checkpoints import build_mistral_checkpoint

    return str(build_mistral_checkpoint(tmp_path_factory.mktemp("mistral-gpu"), seed=3))


def test_mistral_engine_gpu_equals_cpu(tiny_mistral):
    """float32, prompts and generations past the 12-token window: CUDA graphs give eager's greedy tokens, and
    both the CPU torch backend's first tokens (then most whole sequences, as ``test_gpu_equals_cpu_first_tokens``
    allows for GPU rounding)."""
    from minivllm import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    prompts = [f"def function_{i}(x):\n    return " + "x + " * i for i in range(24)]
    with LLM(tiny_mistral, device="cpu") as llm:
        cpu = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    gpu = {}
    for eager in (True, False):
        with LLM(tiny_mistral, device="cuda", dtype="float32", enforce_eager=eager,
                 gpu_memory_utilization=0.3) as llm:
            gpu[eager] = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert gpu[False] == gpu[True]
    assert [g[:8] for g in gpu[True]] == [c[:8] for c in cpu]
    assert sum(g == c for g, c in zip(gpu[True], cpu)) >= 20
