"""The demo model shipped in models/: loads, generates Python-looking text, and equals transformers."""

import os

import pytest

from demo_compare import PROMPTS, compare_with_transformers
from minivllm import LLM, SamplingParams

DEMO = os.path.join(os.path.dirname(__file__), "..", "models", "minivllm-demo-py")
pytestmark = pytest.mark.skipif(not os.path.isdir(DEMO), reason="demo model not in the repo")
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def test_demo_model_float32_equals_transformers_on_cpu():
    llm = LLM(DEMO, device="cpu", dtype="float32")
    outs = [o["token_ids"] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    import torch

    matches, bad = compare_with_transformers(DEMO, outs, "cpu", torch.float32)
    assert matches == len(PROMPTS) and not bad


def test_demo_model_bf16_ties_only_on_cpu():
    llm = LLM(DEMO, device="cpu")  # the checkpoint's dtype: bfloat16
    assert llm.config.dtype == "bfloat16"
    outs = [o["token_ids"] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    matches, bad = compare_with_transformers(DEMO, outs, "cpu")
    assert not bad, f"divergences that are not bf16 ties: {bad}"
    assert matches >= 8


def test_demo_model_continues_python():
    llm = LLM(DEMO, device="cpu")
    text = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)[0]["text"]
    assert text.startswith("\n    "), text  # the body of the function: a new line, indented
