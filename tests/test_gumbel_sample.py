"""The fused Gumbel-max sampler (Triton, run by the interpreter on CPU): distribution, seeds, greedy rows."""

import os

import pytest
import torch

from minivllm.kernels.gumbel_sample import gumbel_sample
from minivllm.sample.metadata import build_sampling_metadata
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU tensors through the Triton interpreter; on GPUs "
                                       "tests/gpu/test_fused_kernels_gpu.py checks the kernel")
V = 8


def tv(tokens: torch.Tensor, p: torch.Tensor) -> float:
    freq = torch.bincount(tokens, minlength=p.numel()).double() / tokens.numel()
    return 0.5 * float((freq - p).abs().sum())


@pytest.mark.slow
def test_draws_follow_softmax_over_temperature():
    logits = torch.tensor([2.0, 1.5, 0.3, -0.5, 1.0, -2.0, 0.8, 0.0])
    n = 1500
    seeds = torch.arange(n, dtype=torch.int64) * 1_000_003 + 17
    tokens = gumbel_sample(logits.repeat(n, 1), seeds, torch.full((n,), 0.7))
    p = torch.softmax(logits.double() / 0.7, 0)
    assert tv(tokens, p) < 0.05  # sampling noise at n = 1500 is about 0.02
    assert tv(tokens, torch.softmax(logits.double() / 1.5, 0)) > 0.1  # the test tells temperatures apart
    assert set(tokens.tolist()) >= {0, 1, 4}  # not an argmax in disguise


def test_a_seed_gives_the_same_token_in_any_batch():
    torch.manual_seed(0)
    logits = torch.randn(5, 64)
    seeds = torch.tensor([11, 22, 33, 44, 55], dtype=torch.int64)
    t = torch.full((5,), 1.0)
    alone = gumbel_sample(logits, seeds, t)
    order = torch.tensor([3, 0, 4, 1, 2])
    shuffled = gumbel_sample(logits[order].contiguous(), seeds[order], t)
    assert shuffled.tolist() == alone[order].tolist()
    other = gumbel_sample(logits, seeds + 1, t)
    assert other.tolist() != alone.tolist()  # (5 rows of 64 tokens: equal by chance ~never)


@pytest.mark.parametrize("block_v", [pytest.param(16, marks=pytest.mark.slow), 64])
def test_the_draw_does_not_depend_on_how_the_vocabulary_is_split(block_v):
    """Chunks of ``block_v`` tokens (a ragged last one: V = 300), then the pick across chunks: the
    same token as one program over the whole row, since the noise is keyed by token id."""
    torch.manual_seed(1)
    logits = torch.randn(6, 300) * 3
    seeds = torch.arange(6, dtype=torch.int64) * 7919 + 3
    t = torch.tensor([1.0, 0.6, 0.0, 2.0, 0.3, 1.0])
    whole = gumbel_sample(logits, seeds, t, block_v=512)
    assert gumbel_sample(logits, seeds, t, block_v=block_v).tolist() == whole.tolist()
    assert whole[2] == logits[2].argmax()  # temperature 0


def test_zero_temperature_ties_across_chunks_keep_the_lowest_id():
    logits = torch.zeros(2, 100)
    logits[0, [90, 20, 55]] = 4.0  # equal maxima in chunks 5, 1 and 3 of 16 tokens
    logits[1, 99] = 1.0
    out = gumbel_sample(logits, torch.tensor([1, 2], dtype=torch.int64), torch.zeros(2), block_v=16)
    assert out.tolist() == [20, 99]


def test_zero_temperature_is_argmax_lowest_id_on_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 5.0, 0.0]])
    out = gumbel_sample(logits, torch.tensor([1, 2], dtype=torch.int64), torch.zeros(2))
    assert out.tolist() == [1, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampler_fused_path_keeps_greedy_rows_seeds_and_min_tokens(dtype):
    torch.manual_seed(1)
    logits = (torch.randn(4, 40) * 3).to(dtype)
    logits[:, 7] = 20.0  # token 7 (EOS here) dominates unless banned
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.9, seed=5),
              SamplingParams(temperature=0.9, min_tokens=3), SamplingParams(temperature=0.9, seed=6)]
    outputs = [[], [1, 2], [1], []]
    md = build_sampling_metadata(params, [[]] * 4, outputs, [7], "cpu", 40)
    fused = Sampler(fused=True)(logits, md).sampled_token_ids
    assert fused[0].item() == int(torch.argmax(logits[0].float()))  # greedy row
    assert fused[2].item() != 7  # min_tokens bans EOS before the 3rd token
    # a seeded row draws the same token alone
    md1 = build_sampling_metadata(params[1:2], [[]], outputs[1:2], [7], "cpu", 40)
    assert Sampler(fused=True)(logits[1:2], md1).sampled_token_ids.item() == fused[1].item()
    # filters the fused pass cannot do fall back to the torch path
    md_top_p = build_sampling_metadata([SamplingParams(temperature=0.9, top_p=0.5, seed=5)], [[]], [[]], [7], "cpu", 40)
    assert Sampler(fused=True)(logits[1:2], md_top_p).sampled_token_ids.item() == \
        Sampler(fused=False)(logits[1:2], md_top_p).sampled_token_ids.item()


def test_bad_inputs_raise_clear_errors():
    logits = torch.zeros(3, 8)
    with pytest.raises(ValueError, match="one seed per row"):
        gumbel_sample(logits, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="one seed per row"):
        gumbel_sample(logits, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\[B, V\] tensor"):
        gumbel_sample(torch.zeros(8), torch.zeros(8, dtype=torch.int64))
    assert gumbel_sample(torch.zeros(0, 8), torch.zeros(0, dtype=torch.int64)).shape == (0,)
    with pytest.raises(ValueError, match="block_v must be a power of two, got 100"):
        gumbel_sample(logits, torch.zeros(3, dtype=torch.int64), block_v=100)


def test_fused_sampler_runs_where_triton_kernels_run():
    """The engine's sampler is ``Sampler(fused=DeviceConfig.triton_sampling)``: fused on CUDA, and on the CPU
    with the triton attention backend (the interpreter); the torch path on the CPU otherwise."""
    from minivllm.config import DeviceConfig

    assert DeviceConfig(device="cuda").triton_sampling and DeviceConfig(device="cuda:1").triton_sampling
    assert DeviceConfig(device="cuda", attention_backend="torch").triton_sampling
    assert not DeviceConfig(device="cpu").triton_sampling
    assert DeviceConfig(device="cpu", attention_backend="triton").triton_sampling
    assert not Sampler().fused and Sampler(fused=True).fused
