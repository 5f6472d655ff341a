"""vLLM's sampling extensions on a GPU, where the Triton kernels, CUDA graphs, asynchronous scheduling and the
fused sampler run: prompt logprobs equal transformers', logit_bias / allowed_token_ids force tokens, and the
rows without edits are unchanged by the rows with them."""

import pytest
import torch

from minivllm import LLM, SamplingParams
from tests.helpers.hf_reference import hf_logits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
PROMPT = [5 + (7 * i) % 200 for i in range(300)]


@pytest.fixture(scope="module")
def llm(tiny_tied_model):
    return LLM(tiny_tied_model, device="cuda", dtype="float32", gpu_memory_utilization=0.3,
               max_num_batched_tokens=128, async_scheduling=True)


def _prompt_logprobs(llm) -> list[float]:
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=2), use_tqdm=False)[0]
    got = out["prompt_logprobs"]
    assert len(got) == len(PROMPT) and got[0] is None
    return [got[j][PROMPT[j]].logprob for j in range(1, len(PROMPT))]


def test_prompt_logprobs_equal_transformers_on_gpu(llm, tiny_tied_model):
    """On the GPU with the torch attention backend (float32 throughout): within 1e-4 of transformers, in chunks
    of 128 under asynchronous scheduling. The Triton backend's float32 attention runs its dots in TF32 (Triton's
    default), ~1e-3 relative: on this model's large random logits its prompt logprobs are within 0.05."""
    want = torch.log_softmax(hf_logits(tiny_tied_model, PROMPT), dim=-1)
    ref = [want[j - 1, PROMPT[j]].item() for j in range(1, len(PROMPT))]
    with LLM(tiny_tied_model, device="cuda", dtype="float32", gpu_memory_utilization=0.2, max_num_batched_tokens=128,
             attention_backend="torch", enforce_eager=True) as exact:
        torch_err = max(abs(a - b) for a, b in zip(_prompt_logprobs(exact), ref))
    triton_err = max(abs(a - b) for a, b in zip(_prompt_logprobs(llm), ref))
    print(f"prompt logprobs, max error against transformers: torch backend {torch_err:.2e}, triton {triton_err:.2e}")
    assert torch_err < 1e-4 and triton_err < 0.05, (torch_err, triton_err)


def test_edits_under_cuda_graphs_and_the_fused_sampler(llm):
    plain = [SamplingParams(temperature=t, max_tokens=24, ignore_eos=True, seed=i) for i, t in enumerate((0, 0.8, 1.0))]
    edited = [SamplingParams(temperature=0.9, max_tokens=24, ignore_eos=True, logit_bias={42: 100}),
              SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=9, allowed_token_ids=[20, 21])]
    prompts = ["def f(x):", "import os\n", "class A:", "x = 1", "for i in"]
    alone = llm.generate(prompts[:3], plain, use_tqdm=False)
    mixed = llm.generate(prompts, plain + edited, use_tqdm=False)
    assert [o["token_ids"] for o in mixed[:3]] == [o["token_ids"] for o in alone]  # seeded or greedy: unchanged
    assert mixed[3]["token_ids"] == [42] * 24
    assert set(mixed[4]["token_ids"]) <= {20, 21}
