"""Tensor parallelism on GPUs (NCCL, CUDA graphs on every rank): TP=2 equals TP=1 in float32."""

import pytest
import torch

from minivllm import LLM, SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [f"def function_{i}(x):\n    return " + "x + " * i for i in range(12)]


@pytest.mark.parametrize("graphs", [False, True])
def test_tp2_equals_tp1_float32(tiny_model, graphs):
    kw = dict(device="cuda", dtype="float32", gpu_memory_utilization=0.3, enforce_eager=not graphs)
    with LLM(tiny_model, **kw) as one:
        expected = [o["token_ids"] for o in one.generate(PROMPTS, GREEDY, use_tqdm=False)]
    with LLM(tiny_model, tensor_parallel_size=2, **kw) as two:
        got = [o["token_ids"] for o in two.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert got == expected
