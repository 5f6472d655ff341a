"""Multi-LoRA on a GPU: the eager float32 path equals transformers + peft, and the default path (Triton
backend, CUDA graphs when the Triton LoRA kernels are installed, asynchronous scheduling) equals its own eager
run for a mixed batch of adapters and the base model."""

import pytest
import torch

from minivllm import LLM, LoRARequest, SamplingParams
from minivllm.lora.ops import HAS_TRITON_LORA
from tests.helpers.lora_adapters import ALL_SEVEN, ATTENTION, MLP, build_lora_adapter, peft_greedy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [[5 + (7 * i + 3 * j) % 300 for j in range(4 + 9 * i)] for i in range(8)]


@pytest.fixture(scope="module")
def loras(tiny_tied_model, tmp_path_factory) -> list[LoRARequest]:
    specs = [(ALL_SEVEN, 8, False), (ATTENTION, 16, True), (MLP, 4, False)]
    return [LoRARequest(f"gpu-{i}", i, str(build_lora_adapter(tiny_tied_model, tmp_path_factory.mktemp(f"gl{i}"),
                                                               t, r, 2 * r, rs, seed=i)))
            for i, (t, r, rs) in enumerate(specs, 1)]


def _mixed(llm: LLM, loras: list[LoRARequest]) -> list[list[int]]:
    choices = [None, *loras]
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=[choices[i % 4] for i in range(len(PROMPTS))])
    return [o["token_ids"] for o in outs]


def test_eager_float32_equals_peft(tiny_tied_model, loras):
    with LLM(tiny_tied_model, device="cuda", dtype="float32", gpu_memory_utilization=0.2, attention_backend="torch",
             enforce_eager=True, enable_lora=True, max_loras=2) as llm:
        got = _mixed(llm, loras)
    choices = [None, *loras]
    for i, (p, tokens) in enumerate(zip(PROMPTS, got)):
        lr = choices[i % 4]
        assert tokens == peft_greedy(tiny_tied_model, lr.lora_path if lr else None, p, 24), f"prompt {i}"


def test_graphs_and_async_scheduling_equal_eager(tiny_tied_model, loras):
    kw = dict(device="cuda", dtype="bfloat16", gpu_memory_utilization=0.2, enable_lora=True, max_loras=2)
    with LLM(tiny_tied_model, **kw, enforce_eager=True, async_scheduling=False) as llm:
        eager = _mixed(llm, loras)
    with LLM(tiny_tied_model, **kw, async_scheduling=True) as llm:
        assert (llm.engine.executor.runner.graph_runner is not None) == HAS_TRITON_LORA
        fast = _mixed(llm, loras)
    assert fast == eager
