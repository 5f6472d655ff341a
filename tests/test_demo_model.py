"""The demo model shipped in models/: loads, generates Python-looking text, equals transformers, and is
greedy-deterministic on the CPU whatever the batch."""

import os

import pytest
import torch

from minivllm import LLM, SamplingParams
from tests.helpers.demo_compare import PROMPTS, compare_with_transformers

DEMO = os.path.join(os.path.dirname(__file__), "..", "models", "minivllm-demo-py")
pytestmark = pytest.mark.skipif(not os.path.isdir(DEMO), reason="demo model not in the repo")
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def demo():
    """The demo model on the CPU with every default (float32 there; the checkpoint is bf16)."""
    with LLM(DEMO, device="cpu") as llm:
        yield llm


@pytest.mark.slow
def test_demo_model_defaults_to_float32_on_cpu_and_equals_transformers(demo):
    assert demo.engine.config.model_config.arch.dtype == "bfloat16"  # the checkpoint's
    assert demo.engine.config.model_config.dtype == "float32"  # the CPU's default
    assert next(demo.engine.executor.runner.model.parameters()).dtype == torch.float32
    outs = [o["token_ids"] for o in demo.generate(PROMPTS, GREEDY, use_tqdm=False)]
    matches, bad = compare_with_transformers(DEMO, outs, "cpu", torch.float32)
    assert matches == len(PROMPTS) and not bad


@pytest.mark.slow
def test_demo_model_bf16_ties_only_on_cpu():
    with LLM(DEMO, device="cpu", dtype="bfloat16") as llm:  # the checkpoint's dtype, asked for
        assert llm.engine.config.model_config.dtype == "bfloat16"
        assert next(llm.engine.executor.runner.model.parameters()).dtype == torch.bfloat16
        outs = [o["token_ids"] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    matches, bad = compare_with_transformers(DEMO, outs, "cpu")
    assert not bad, f"divergences that are not bf16 ties: {bad}"
    assert matches >= 8


@pytest.mark.slow
def test_demo_model_greedy_is_the_same_alone_and_in_a_batch(demo):
    """Acceptance: the demo model runs greedy-deterministically on the CPU regardless of batch. Each prompt
    alone, then all of them in one batch (the defaults: float32, synchronous scheduling), 48 new tokens."""
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    alone = [demo.generate([p], params, use_tqdm=False)[0]["token_ids"] for p in PROMPTS]
    batch = [o["token_ids"] for o in demo.generate(PROMPTS, params, use_tqdm=False)]
    assert all(len(t) == 48 for t in alone)
    diff = [i for i, (a, b) in enumerate(zip(alone, batch)) if a != b]
    assert not diff, f"prompts whose greedy tokens depend on the batch: {[PROMPTS[i] for i in diff]}"


def test_demo_model_continues_python():
    with LLM(DEMO, device="cpu", max_model_len=128, num_kvcache_blocks=8) as llm:  # NOTE: a small cache loads fast
        text = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)[0]["text"]
    assert text.startswith("\n    "), text  # the body of the function: a new line, indented
