"""Grammar masks on logits: the torch reference against a plain loop, the Triton kernel against the reference
(the interpreter on the CPU; tests/gpu on GPUs), and the sampler with a grammar beside other edits."""

from __future__ import annotations

import os

import pytest
import torch

from minivllm.kernels.torch_backend import apply_grammar_bitmask_ref
from minivllm.sample.metadata import build_sampling_metadata
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams

interpret = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                               reason="CPU tensors through the Triton interpreter")


def _pack(allowed: torch.Tensor) -> torch.Tensor:
    """[R, V] bool -> [R, ceil(V / 32)] int32, token t at bit t % 32 of word t // 32."""
    R, V = allowed.shape
    W = (V + 31) // 32
    bits = torch.zeros(R, W * 32, dtype=torch.int64)
    bits[:, :V] = allowed.long()
    words = (bits.view(R, W, 32) << torch.arange(32)).sum(-1)  # [R, W] in [0, 2^32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _case(B, V, rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, V, generator=g)
    allowed = torch.rand(len(rows), V, generator=g) < 0.3
    allowed[:, -1] = True  # the last token (the highest bit of the last word, a negative int32) is allowed
    return logits, torch.tensor(rows, dtype=torch.int64), allowed


@pytest.mark.parametrize("B, V, rows", [(1, 33, [0]), (4, 100, [1, 3]), (5, 4032, [0, 1, 2, 3, 4]), (3, 64, [])])
def test_reference_masks_exactly_the_disallowed_tokens_of_the_constrained_rows(B, V, rows):
    logits, idx, allowed = _case(B, V, rows)
    out = apply_grammar_bitmask_ref(logits.clone(), idx, _pack(allowed))
    want = logits.clone()
    for j, r in enumerate(rows):
        want[r][~allowed[j]] = float("-inf")
    assert torch.equal(out, want)


@interpret
@pytest.mark.triton
@pytest.mark.parametrize("B, V, rows, block_w", [(1, 33, [0], 64), (4, 100, [1, 3], 2), (6, 4032, [5, 0, 2], 64),
                                                  (2, 1000, [1], 8)])
def test_triton_kernel_equals_the_reference(B, V, rows, block_w):
    from minivllm.kernels.grammar_mask import apply_grammar_bitmask

    logits, idx, allowed = _case(B, V, rows, seed=B)
    mask = _pack(allowed)
    want = apply_grammar_bitmask_ref(logits.clone(), idx, mask)
    got = apply_grammar_bitmask(logits.clone(), idx, mask, block_w=block_w)
    assert torch.equal(got, want)


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=interpret)])
def test_sampler_keeps_constrained_rows_inside_their_grammar(fused):
    V, B = 70, 4
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(3)) * 3
    allowed = torch.zeros(2, V, dtype=torch.bool)
    allowed[0, [5, 6, 69]] = True
    allowed[1, [int(logits[3].argmin())]] = True  # the row's least likely token: the grammar wins
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.0, logit_bias={7: 100.0}),
              SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, logit_bias={8: 100.0})]
    md = build_sampling_metadata(params, [[]] * B, [[]] * B, [], "cpu", V, grammar=([1, 3], _pack(allowed)))
    for _ in range(20):
        tok = Sampler(fused=fused)(logits.clone(), md).sampled_token_ids.tolist()
        assert tok[1] in (5, 6, 69) and tok[3] == int(logits[3].argmin())
        assert tok[2] == int(logits[2].argmax())  # a free greedy row is untouched
