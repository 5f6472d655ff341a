"""Structured outputs on a GPU, where the grammar mask is a Triton kernel, decode steps replay CUDA graphs and
the masks are filled under asynchronous scheduling while the forward runs: the kernel equals the torch
reference, and the demo model's outputs under the twenty schemas, a regex and a choice are valid."""

import json
import re
from pathlib import Path

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.kernels.torch_backend import apply_grammar_bitmask_ref
from tests.helpers.json_schemas import SCHEMAS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEMO = Path(__file__).resolve().parents[2] / "models" / "minivllm-demo-py"


@pytest.mark.parametrize("B, V, R", [(1, 33, 1), (8, 4032, 3), (256, 151_936, 256), (300, 151_936, 64)])
def test_grammar_mask_kernel_equals_the_reference(B, V, R):
    from minivllm.kernels.grammar_mask import apply_grammar_bitmask

    g = torch.Generator(device="cuda").manual_seed(B)
    logits = torch.randn(B, V, device="cuda", generator=g)
    rows = torch.randperm(B, device="cuda", generator=g)[:R]
    W = (V + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (R, W), dtype=torch.int32, device="cuda", generator=g)
    want = apply_grammar_bitmask_ref(logits.clone(), rows, bitmask)
    got = apply_grammar_bitmask(logits.clone(), rows, bitmask)
    assert torch.equal(got, want)


def test_demo_model_outputs_are_valid_under_cuda_graphs_and_async_scheduling():
    pytest.importorskip("llguidance")
    jsonschema = pytest.importorskip("jsonschema")
    from minivllm.sampling_params import StructuredOutputsParams as SO

    with LLM(str(DEMO), device="cuda", gpu_memory_utilization=0.3, async_scheduling=True) as llm:
        cases = [SO(json=s) for s in SCHEMAS.values()] + [SO(regex=r"[0-9]{3}-[a-z]{2,5}"), SO(choice=["yes", "no"])]
        free = SamplingParams(temperature=0.8, max_tokens=40, seed=3)
        params = [SamplingParams(temperature=t, max_tokens=200, seed=i, structured_outputs=c)
                  for t in (0.0, 1.0) for i, c in enumerate(cases)] + [free] * 8
        outs = llm.generate(["Return JSON:\n"] * len(params), params, use_tqdm=False)
        for p, out in zip(params, outs):
            c = p.structured_outputs
            if c is None:
                assert len(out["token_ids"]) > 0
                continue
            assert out["finish_reason"] == "stop", (c.kind, out["text"])
            if c.kind == "json":
                jsonschema.validate(json.loads(out["text"]), c.json)
            elif c.kind == "regex":
                assert re.fullmatch(c.regex, out["text"])
            else:
                assert out["text"] in c.choice
