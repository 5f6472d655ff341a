"""The engine through the Triton backend (in the interpreter on the CPU) equals the torch backend."""

import pytest

from minivllm import LLM, SamplingParams

pytestmark = pytest.mark.triton


def test_triton_backend_matches_torch_backend_with_chunks_and_decode(tiny_tied_model):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = ["def hello(x):", "import os\nimport sys", "a" * 40, "x"]
    ref = LLM(tiny_tied_model, device="cpu").generate(prompts, params, use_tqdm=False)
    # a small budget forces chunked prefill mixed with decode rows in one launch
    tri = LLM(tiny_tied_model, device="cpu", attention_backend="triton", max_num_batched_tokens=16)
    got = tri.generate(prompts, params, use_tqdm=False)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in ref]
