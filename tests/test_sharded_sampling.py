"""Vocabulary-sharded sampling under tensor parallelism: exactly the unsharded fused sampler's tokens.

Kernels (Triton interpreter): a [B, V] batch cut into N vocabulary slices as ``ParallelLMHead`` cuts
it (a zero-padded last slice), each sampled by ``gumbel_sample_shard``, then ``pick_across_shards``,
gives ``gumbel_sample``'s tokens. Engine (gloo; ``attention_backend="triton"``, so the CPU runs the Triton
sampler in the interpreter and TP=2 samples sharded): TP=2 gives TP=1's tokens, and the sharded path is
really taken.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.kernels.gumbel_sample import gumbel_sample, gumbel_sample_shard, pick_across_shards
from minivllm.sample.sharded import sharded_temperatures
from tests.helpers.checkpoints import build_checkpoint

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU tensors through the Triton interpreter; on GPUs "
                                       "tests/gpu/test_tp_gpu.py checks the sharded path")


def _slices(logits: torch.Tensor, n: int) -> list[tuple[torch.Tensor, int]]:
    """``(slice, vocab_start)`` of each of ``n`` ranks: ``ceil(V / n)`` columns each, the tail zero-padded."""
    batch, vocab = logits.shape
    per = -(-vocab // n)
    padded = torch.zeros(batch, per * n, dtype=logits.dtype)
    padded[:, :vocab] = logits
    return [(padded[:, r * per:(r + 1) * per].contiguous(), r * per) for r in range(n)]


def _sharded(logits, seeds, temperature, n: int, block_v: int = 4096) -> torch.Tensor:
    vocab = logits.shape[1]
    return pick_across_shards([gumbel_sample_shard(part, seeds, temperature, start, vocab, block_v)
                               for part, start in _slices(logits, n)])


@pytest.mark.parametrize("batch,vocab,n,block_v", [
    pytest.param(6, 300, 2, 4096, marks=pytest.mark.slow), (6, 300, 2, 64),
    *(pytest.param(*case, marks=pytest.mark.slow) for case in [(5, 449, 3, 32), (9, 1000, 4, 128), (4, 64, 8, 16),
                                                               (4, 5, 4, 16)])])
def test_slices_then_pick_equal_the_whole_row(batch, vocab, n, block_v):
    """Greedy and temperature rows; odd rows lie far below 0, where an unmasked zero pad would win.
    (4, 5, 4): the last slice starts past the vocabulary (all padding)."""
    g = torch.Generator().manual_seed(batch * vocab + n)
    logits = torch.randn(batch, vocab, generator=g) * 3
    logits[1::2] -= 40.0
    seeds = torch.randint(0, 2**62, (batch,), dtype=torch.int64, generator=g)
    t = torch.tensor([0.0, 0.5, 1.0, 1.7, 0.0, 0.8, 1.0, 0.3, 2.0][:batch])
    whole = gumbel_sample(logits, seeds, t)
    assert _sharded(logits, seeds, t, n, block_v).tolist() == whole.tolist()
    assert _sharded(logits, seeds, None, n, block_v).tolist() == gumbel_sample(logits, seeds).tolist()
    argmax = logits.argmax(-1)
    assert _sharded(logits, None, None, n, block_v).tolist() == argmax.tolist()  # all greedy: no seeds
    assert whole[t == 0].tolist() == argmax[t == 0].tolist()
    if vocab > 64:
        assert (whole != argmax).any()  # the temperature rows are really noisy


def test_bfloat16_slices_equal_the_whole_row():
    g = torch.Generator().manual_seed(7)
    logits = (torch.randn(8, 333, generator=g) * 4).to(torch.bfloat16)
    seeds = torch.arange(8, dtype=torch.int64) * 1_000_003 + 5
    t = torch.tensor([1.0, 0.0, 0.7, 1.2, 0.0, 1.0, 0.5, 0.9])
    assert _sharded(logits, seeds, t, 2, 64).tolist() == gumbel_sample(logits, seeds, t).tolist()


def test_ties_go_to_the_lowest_token_id_across_slices():
    """Greedy ties across slice borders (V = 10 in 3 slices of 4: ids 0-3, 4-7, 8-9 + 2 pads)."""
    logits = torch.full((4, 10), -1.0)
    logits[0, [6, 2]] = 5.0  # slices 1 and 0
    logits[1, [9, 5]] = 5.0  # slices 2 and 1
    logits[2, [4, 8]] = 5.0  # slices 1 and 2
    logits[3] = -3.0  # every id ties (the zero pads must not win)
    expected = [2, 5, 4, 0]
    seeds = torch.arange(4, dtype=torch.int64)
    assert _sharded(logits, None, None, 3).tolist() == expected
    assert _sharded(logits, seeds, torch.zeros(4), 3).tolist() == expected
    assert gumbel_sample(logits, seeds, torch.zeros(4)).tolist() == expected
    # equal noisy bests from two slices: the first slice's id
    pairs = [torch.tensor([[1.5, 3.0], [2.0, 1.0]], dtype=torch.float64),
             torch.tensor([[1.5, 7.0], [2.5, 6.0]], dtype=torch.float64)]
    assert pick_across_shards(pairs).tolist() == [3, 6]


def test_shard_bad_inputs_raise_clear_errors():
    logits = torch.zeros(3, 8)
    with pytest.raises(ValueError, match="vocab_start >= 0"):
        gumbel_sample_shard(logits, None, None, -8, 16)
    with pytest.raises(ValueError, match="one seed per row"):
        gumbel_sample_shard(logits, torch.zeros(2, dtype=torch.int64), None, 0, 16)
    assert gumbel_sample_shard(torch.zeros(0, 8), None, None, 0, 16).shape == (0, 2)


def test_which_steps_qualify_for_the_sharded_path():
    sp = SamplingParams
    greedy, plain = sp(temperature=0), sp(temperature=0.7, seed=3)
    got = sharded_temperatures([greedy, plain, sp(temperature=1.0, top_k=500)], [0, 2, 1], 448, fused=True)
    assert got.dtype == np.float32 and got.tolist() == [0.0, np.float32(0.7), 1.0]  # top_k >= V: no filter
    assert sharded_temperatures([greedy, greedy], [0, 0], 448, fused=False).tolist() == [0.0, 0.0]
    assert sharded_temperatures([greedy, plain], [0, 0], 448, fused=False) is None
    assert sharded_temperatures([plain, sp(temperature=0.5, min_tokens=2)], [0, 2], 448, fused=True) is not None
    for other in (sp(logprobs=0), sp(temperature=0, logprobs=2), sp(repetition_penalty=1.1), sp(presence_penalty=0.5),
                  sp(temperature=0, frequency_penalty=0.5), sp(top_k=10), sp(top_p=0.9), sp(min_p=0.1),
                  sp(min_tokens=3)):
        assert sharded_temperatures([plain, other], [0, 2], 448, fused=True) is None, other
    assert sharded_temperatures([], [], 448, fused=True) is None


# ------------------------------------------------------------------------------------------ engine

gloo = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                          reason="needs torch.distributed with gloo")
KW = dict(device="cpu", dtype="float32", max_model_len=256, attention_backend="triton")
PROMPTS = [[(7 * i + 3 * j + 1) % 380 for j in range(3 + 9 * i)] for i in range(8)]
GREEDY = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)


def _seeded(i: int, **kw) -> SamplingParams:
    return SamplingParams(**{"temperature": (0.6, 1.0, 1.4)[i % 3], "seed": 100 + i, "max_tokens": 14,
                             "ignore_eos": True, **kw})


MIXED = [_seeded(0), _seeded(1, logprobs=2, max_tokens=5), GREEDY, _seeded(3, top_p=0.9, max_tokens=7),
         _seeded(4, min_tokens=4), SamplingParams(temperature=0, logprobs=0, max_tokens=3), _seeded(6), GREEDY]


@pytest.fixture(scope="module")
def odd_vocab_model(tmp_path_factory) -> str:
    """A tied tiny checkpoint with 447 ids: TP=2's second slice ends with one zero-padded column."""
    return str(build_checkpoint(tmp_path_factory.mktemp("tiny-odd-vocab"), "tied", seed=2, vocab_size=447))


@pytest.fixture(scope="module")
def engines(odd_vocab_model):
    """(TP=1, TP=2 with sharded sampling, TP=2 sharded + async scheduling), all on the Triton backend (the fused
    sampler; sharded sampling at TP=2), one torch thread each."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    llms = []
    try:
        llms.append(LLM(odd_vocab_model, **KW))
        llms.append(LLM(odd_vocab_model, tensor_parallel_size=2, **KW))
        llms.append(LLM(odd_vocab_model, tensor_parallel_size=2, async_scheduling=True, **KW))
        yield llms
    finally:
        for llm in llms:
            llm.close()
        torch.set_num_threads(prev)


def _generate(llm: LLM, params) -> tuple[list[dict], int, int]:
    """Outputs, and how many steps rank 0 sampled sharded and through the gathered logits."""
    runner = llm.engine.executor.runner
    gathered = []
    sample = runner._sample
    runner._sample = lambda *a: gathered.append(1) or sample(*a)
    before = runner.num_sharded_steps
    try:
        out = llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        del runner._sample
    return out, runner.num_sharded_steps - before, len(gathered)


def _tokens(outputs: list[dict]) -> list[list[int]]:
    return [o["token_ids"] for o in outputs]


@gloo
@pytest.mark.slow
def test_greedy_tp2_sharded_equals_tp1(engines):
    """All-greedy steps take the sharded path."""
    one, two, _ = engines
    assert two.engine.executor.runner.sharded_sampling and not one.engine.executor.runner.sharded_sampling
    assert one.engine.executor.runner.sampler.fused and two.engine.executor.runner.sampler.fused
    expected = _tokens(one.generate(PROMPTS, GREEDY, use_tqdm=False))
    out, sharded, gathered = _generate(two, GREEDY)
    assert _tokens(out) == expected
    assert sharded > 0 and gathered == 0


@gloo
@pytest.mark.slow
def test_seeded_temperature_tp2_sharded_equals_tp1(engines):
    one, two, _ = engines
    params = [GREEDY if i % 4 == 0 else _seeded(i) for i in range(len(PROMPTS))]
    expected = _tokens(one.generate(PROMPTS, params, use_tqdm=False))
    out, sharded, gathered = _generate(two, params)
    assert _tokens(out) == expected
    assert sharded > 0 and gathered == 0
    greedy = _tokens(one.generate(PROMPTS, GREEDY, use_tqdm=False))
    assert sum(a != b for a, b in zip(expected, greedy)) >= 4  # the temperature rows really sample


@gloo
@pytest.mark.slow
def test_steps_that_need_the_gathered_logits_keep_the_gather_path(engines):
    """Every step has a row the fused Gumbel pass cannot sample alone (top-p, or logprobs): every step gathers
    the logits to rank 0, and the tokens are TP=1's."""
    one, two, _ = engines
    params = [_seeded(i, top_p=0.9) if i % 2 else _seeded(i, logprobs=1) for i in range(len(PROMPTS))]
    expected = _tokens(one.generate(PROMPTS, params, use_tqdm=False))
    out, sharded, gathered = _generate(two, params)
    assert _tokens(out) == expected
    assert sharded == 0 and gathered > 0


@gloo
@pytest.mark.slow
@pytest.mark.parametrize("which", ["sync", "async"])
def test_mixed_batch_tp2_equals_tp1(engines, which):
    """Rows that need the gathered logits (logprobs, top_p, a pending min_tokens) beside plain rows: steps
    with any of them gather, the steps after they finish sample sharded; async scheduling feeds the
    sharded steps' tokens to the next step on every rank."""
    one, two, two_async = engines
    llm = two_async if which == "async" else two
    assert llm.engine.executor.runner.share_sampled == (which == "async")
    expected = one.generate(PROMPTS, MIXED, use_tqdm=False)
    out, sharded, gathered = _generate(llm, MIXED)
    assert _tokens(out) == _tokens(expected)
    assert sharded > 0 and gathered > 0
    for got, exp in zip(out, expected):
        assert ("logprobs" in got) == ("logprobs" in exp)
        for a, b in zip(got.get("logprobs", []), exp.get("logprobs", []), strict=True):
            assert a.keys() == b.keys() and all(abs(a[t] - b[t]) < 1e-4 for t in a)


def test_sharded_sampling_needs_a_device_that_runs_triton():
    """A TP > 1 runner samples sharded iff ``DeviceConfig.triton_sampling``: on CUDA, and on the CPU with the
    triton backend (the interpreter); the CPU's torch backend gathers every step's logits."""
    from minivllm.config import DeviceConfig

    assert DeviceConfig(device="cuda", attention_backend="torch").triton_sampling
    assert DeviceConfig(device="cpu", attention_backend="triton").triton_sampling
    assert not DeviceConfig(device="cpu").triton_sampling
    assert not DeviceConfig(device="cpu", attention_backend="torch").triton_sampling
