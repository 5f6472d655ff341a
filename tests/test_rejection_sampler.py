"""Rejection sampling of drafts: greedy rows against the plain sampler's token-by-token chain, the emitted
tokens' distribution (chi-square against the target's processed distribution, and biased samplers that the same
test rejects), seeds, penalties over the drafts, grammar masks at draft positions, logprobs, the on-device
layout and bad arguments."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import minivllm.sample.rejection_sampler as rs
from minivllm.sample.metadata import build_sampling_metadata
from minivllm.sample.penalties import PenaltyState
from minivllm.sample.rejection_sampler import rejection_sample
from minivllm.sample.sampler import Sampler, _exponential_race, apply_sampling_filters
from minivllm.sample.spec_metadata import build_spec_sampling_metadata
from minivllm.sampling_params import SamplingParams
from tests.helpers.chi_square import chi_square_p_value
from tests.helpers.sampler_reference import filtered_probs

V = 12
EOS = [11]
ALPHA = 1e-3  # a correct sampler passes at this level (fixed seeds: the same draws every run)
BIASED_P = 1e-6  # ... and a biased one falls far below it
sampler = Sampler()


def _spec(params, drafts, logits, draft_probs=None, *, prompts=None, outputs=None, generator=None, grammar=None,
          bad_words=None, penalty_tensors=None, layout_on_device=False, triton=False):
    """``rejection_sample`` of rows ``params`` with drafts ``drafts`` (lists) over ``logits`` ([P, V])."""
    rows = len(params)
    md = build_spec_sampling_metadata(
        params, prompts or [[] for _ in range(rows)], outputs or [[] for _ in range(rows)], drafts, EOS,
        logits.device, logits.shape[1], generator, grammar, bad_words=bad_words, penalty_tensors=penalty_tensors)
    ids = torch.tensor([t for d in drafts for t in d], dtype=torch.int64)
    num = [len(d) for d in drafts]
    return rejection_sample(logits, torch.tensor(num) if layout_on_device else num, ids, draft_probs, md,
                            triton=triton)


def _plain_token(params, logits_row, prompt=(), output=(), bad_words=()):
    """The plain sampler's token (and output) for one row whose output so far is ``output``."""
    md = build_sampling_metadata([params], [list(prompt)], [list(output)], EOS, "cpu", logits_row.shape[-1],
                                 bad_words=[list(bad_words)])
    return sampler(logits_row.view(1, -1), md)


# ------------------------------------------------------------------ greedy: exactly the token-by-token chain

GREEDY_PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, presence_penalty=0.8, frequency_penalty=0.5, repetition_penalty=1.4),
    SamplingParams(temperature=0.0, min_tokens=4, logit_bias={3: 0.7, 11: 1.5}),
    SamplingParams(temperature=0.0, allowed_token_ids=[0, 2, 3, 5, 8, 11], frequency_penalty=1.0),
    SamplingParams(temperature=0.0, top_p=0.3, top_k=2, seed=7),  # filters do not touch greedy rows
]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), which=st.lists(st.integers(0, len(GREEDY_PARAMS) - 1), min_size=1, max_size=4),
       k=st.lists(st.integers(0, 4), min_size=4, max_size=4), miss=st.lists(st.integers(0, 5), min_size=4, max_size=4),
       on_device=st.booleans())
def test_greedy_rows_emit_the_plain_greedy_chain(seed, which, k, miss, on_device):
    """Drafts that follow the plain sampler's chain up to one wrong token: the row emits the chain up to and with
    the target's token there (all right: every draft and the bonus token), whatever penalties and edits it has."""
    g = torch.Generator().manual_seed(seed)
    params = [GREEDY_PARAMS[w] for w in which]
    prompts = [torch.randint(0, V, (3,), generator=g).tolist() for _ in params]
    outputs = [torch.randint(0, V, (2,), generator=g).tolist() for _ in params]
    bad_words = [[[1], [4, 6]] for _ in params]
    drafts, logits, expected = [], [], []
    for r, p in enumerate(params):
        rows = torch.randn(k[r] + 1, V, generator=g) * 0.7  # [k + 1, V]: small, so that penalties decide
        chain, row_drafts = [], []
        for j in range(k[r] + 1):
            token = _plain_token(p, rows[j], prompts[r], outputs[r] + row_drafts, bad_words[r]).sampled_token_ids
            chain.append(int(token))
            if j < k[r]:  # the j-th draft: the chain's token, except a wrong one at offset `miss`
                row_drafts.append(chain[-1] if j != miss[r] else (chain[-1] + 1) % V)
            if j == min(miss[r], k[r]):
                break
        tail = torch.randint(0, V, (k[r] - len(row_drafts),), generator=g)  # drafts after a miss: anything
        row_drafts += tail.tolist()
        drafts.append(row_drafts)
        logits.append(rows)
        expected.append(row_drafts[:min(miss[r], k[r])] + chain[-1:])
    out = _spec(params, drafts, torch.cat(logits), prompts=prompts, outputs=outputs, bad_words=bad_words,
                layout_on_device=on_device)
    assert out.token_id_lists() == expected
    assert out.num_accepted.tolist() == [min(m, n) for m, n in zip(miss, k)][:len(params)]
    assert out.emitted.sum().item() == sum(map(len, expected))
    assert out.last_token_ids.tolist() == [e[-1] for e in expected]


def test_greedy_hand_built_rows():
    logits = torch.zeros(8, V)
    logits[torch.arange(8), torch.tensor([4, 6, 1, 9, 2, 2, 3, 8])] = 5.0  # the target's argmax at each position
    params = [SamplingParams(temperature=0.0)] * 3
    drafts = [[4, 6, 1], [], [2, 7]]  # all accepted (+ bonus 9); no drafts (2); one accepted, then 3 not 7
    out = _spec(params, drafts, logits)
    assert out.token_id_lists() == [[4, 6, 1, 9], [2], [2, 3]]
    assert out.last_token_ids.tolist() == [9, 2, 3]
    assert out.num_accepted.tolist() == [3, 0, 1]
    assert out.emitted.tolist() == [True] * 7 + [False]
    out = _spec(params, [[5, 6, 1], [], [3, 3]], logits)  # the first draft wrong: the target's token alone
    assert out.token_id_lists() == [[4], [2], [2]] and out.num_accepted.tolist() == [0, 0, 0]
    assert out.emitted.tolist() == [True, False, False, False, True, True, False, False]


# ------------------------------------------------------------------ the distribution: chi-square

FILTERS = {"temperature_1": dict(temperature=1.0), "top_p": dict(temperature=1.0, top_p=0.7)}
SLOW_FILTERS = {
    "temperature_0.7_top_k": dict(temperature=0.7, top_k=6),
    "min_p": dict(temperature=1.3, min_p=0.1),
    "penalties": dict(temperature=1.0, top_p=0.9, presence_penalty=0.6, frequency_penalty=0.4,
                      repetition_penalty=1.2),
}


def _trials(kind: str, params: SamplingParams, n: int, seed: int, k: int = 2):
    """``n`` copies of one row with ``k`` drafts over the same target logits: ``(emitted [n, k + 1] with -1
    past each row's tokens, drafts [n, k], the target's distributions q_j at each position)``. Deterministic
    drafts are fixed tokens; random ones are drawn per row from a proposer that disagrees with the target."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(k + 1, V, generator=g)  # [k + 1, V]
    prompt = [1, 2, 2]
    if kind == "deterministic":
        # the first draft is the target's second most likely token (accepted only sometimes), the later ones
        # its most likely given the drafts before (so that rows reach every position)
        row = []
        for j in range(k):
            row.append(int(filtered_probs(target[j], params, prompt, row).argsort(descending=True)[int(j == 0)]))
        drafts = torch.tensor([row] * n)  # [n, k]
        draft_probs = None
    else:
        proposer = torch.softmax(torch.randn(k, V, generator=g) * 1.5, dim=-1)  # [k, V]
        drafts = torch.multinomial(proposer, n, replacement=True, generator=g).T  # [n, k]
        draft_probs = proposer.repeat(n, 1)  # [n * k, V]
    out = _spec([params] * n, drafts.tolist(), target.repeat(n, 1), draft_probs, prompts=[prompt] * n,
                generator=torch.Generator().manual_seed(seed + 1))
    tokens = out.sampled_token_ids.view(n, k + 1)
    emitted = torch.where(out.emitted.view(n, k + 1), tokens, -1)
    # q_j of the rows that reach position j: their output so far is the first j drafts (for the penalties)
    return emitted, drafts, target, prompt


def _check_positions(emitted, drafts, target, prompt, params, positions):
    """The chi-square p-values of the tokens emitted at ``positions`` (of the rows that reach them, grouped by the
    drafts before them when those vary) against the target's processed distribution there."""
    p_values = []
    for j in positions:
        reach = emitted[:, j] >= 0
        if j == 0:
            p_values.append(chi_square_p_value(emitted[:, 0], filtered_probs(target[0], params, prompt)))
            continue
        # rows that reached j accepted drafts 0..j-1: with penalties, group them by those drafts (the context of
        # position j); without, q_j is the same for all of them
        groups: dict[tuple[int, ...], list[int]] = {}
        for i in torch.nonzero(reach).flatten().tolist():
            groups.setdefault(tuple(drafts[i, :j].tolist()) if params.has_penalties else (), []).append(i)
        ctx, rows = max(groups.items(), key=lambda kv: len(kv[1]))
        assert len(rows) >= 100, f"too few rows reach position {j} for a test"
        q = filtered_probs(target[j], params, prompt, list(ctx))
        p_values.append(chi_square_p_value(emitted[rows, j], q))
    return p_values


@pytest.mark.parametrize("kind", ["deterministic", "random"])
@pytest.mark.parametrize("filt", list(FILTERS))
def test_emitted_tokens_follow_the_target_distribution(kind, filt):
    params = SamplingParams(**FILTERS[filt])
    emitted, drafts, target, prompt = _trials(kind, params, n=4000, seed=11)
    first, second = _check_positions(emitted, drafts, target, prompt, params, [0, 1])
    assert first > ALPHA and second > ALPHA, (first, second)
    # the drafts are neither always nor never accepted, so that both branches are exercised
    accepted = (emitted[:, 1] >= 0).double().mean().item()
    assert 0.05 < accepted < 0.95


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["deterministic", "random"])
@pytest.mark.parametrize("filt", list(FILTERS) + list(SLOW_FILTERS))
def test_emitted_tokens_follow_the_target_distribution_many_trials(kind, filt):
    params = SamplingParams(**{**FILTERS, **SLOW_FILTERS}[filt])
    emitted, drafts, target, prompt = _trials(kind, params, n=60_000, seed=5, k=3)
    p_values = _check_positions(emitted, drafts, target, prompt, params, [0, 1, 2, 3])
    assert min(p_values) > ALPHA, p_values


def _accept_always(real):
    def biased(x, draft_at, draft_probs, layout, md):
        accepted, recovered = real(x, draft_at, draft_probs, layout, md)
        return torch.ones_like(accepted), recovered
    return biased


def _no_residual(real):
    """The classic slip: after a rejection, draw from the target's q instead of the residual max(0, q - p)."""
    def biased(x, draft_at, draft_probs, layout, md):
        q = torch.softmax(apply_sampling_filters(x.clone(), md), dim=-1)
        accepted, _ = real(x, draft_at, draft_probs, layout, md)
        return accepted, _exponential_race(q, md)
    return biased


@pytest.mark.parametrize("kind", ["deterministic", "random"])
@pytest.mark.parametrize("bias", [_accept_always, _no_residual])
def test_the_same_test_rejects_a_biased_sampler(monkeypatch, kind, bias):
    monkeypatch.setattr(rs, "_accept_and_recover", bias(rs._accept_and_recover))
    params = SamplingParams(**FILTERS["temperature_1"])
    emitted, drafts, target, prompt = _trials(kind, params, n=4000, seed=11)
    (first,) = _check_positions(emitted, drafts, target, prompt, params, [0])
    assert first < BIASED_P, first


def test_a_proposer_equal_to_the_target_is_always_accepted():
    g = torch.Generator().manual_seed(3)
    n, k = 64, 3
    target = torch.randn(k + 1, V, generator=g)
    proposer = torch.softmax(target[:k], dim=-1)  # exactly the target's distribution at each draft position
    drafts = torch.multinomial(proposer, n, replacement=True, generator=g).T  # [n, k]
    out = _spec([SamplingParams()] * n, drafts.tolist(), target.repeat(n, 1), proposer.repeat(n, 1))
    assert out.num_accepted.tolist() == [k] * n
    assert out.sampled_token_ids.view(n, k + 1)[:, :k].tolist() == drafts.tolist()


def test_a_draft_outside_the_filtered_support_is_never_accepted():
    g = torch.Generator().manual_seed(4)
    n = 500
    target = torch.randn(2, V, generator=g)
    params = SamplingParams(top_k=3)
    outside = int(target[0].argsort()[0])  # the least likely token: cut by top-k
    out = _spec([params] * n, [[outside]] * n, target.repeat(n, 1))
    assert out.num_accepted.sum().item() == 0
    assert (filtered_probs(target[0], params)[out.sampled_token_ids.view(n, 2)[:, 0]] > 0).all()


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    rows=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.5, 1.0, 2.0]),  # temperature
            st.sampled_from([-1, 1, 3, V]),  # top_k
            st.sampled_from([1.0, 0.8, 0.3]),  # top_p
            st.sampled_from([0.0, 0.2]),  # min_p
            st.sampled_from([None, 0, 5]),  # seed
            st.integers(0, 4),  # drafts
        ),
        min_size=1, max_size=5,
    ),
    with_probs=st.booleans(),
)
def test_emitted_tokens_stay_in_each_positions_support(seed, rows, with_probs):
    """Any mix of rows: accepted drafts come first, then one token; every emitted token has positive processed
    probability at its position."""
    g = torch.Generator().manual_seed(seed)
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m, seed=s) for t, k, p, m, s, _ in rows]
    drafts = [torch.randint(0, V, (n,), generator=g).tolist() for *_, n in rows]
    logits = torch.randn(sum(len(d) + 1 for d in drafts), V, generator=g) * 2
    num = sum(map(len, drafts))
    probs = torch.softmax(torch.randn(num, V, generator=g), dim=-1) if with_probs else None
    out = _spec(params, drafts, logits, probs)
    start = 0
    for r, (p, tokens) in enumerate(zip(params, out.token_id_lists())):
        accepted = out.num_accepted[r].item()
        assert len(tokens) == accepted + 1 and tokens[:accepted] == drafts[r][:accepted]
        for j, token in enumerate(tokens):
            assert filtered_probs(logits[start + j], p)[token] > 0, (r, j, token)
        start += len(drafts[r]) + 1


# ------------------------------------------------------------------ seeds


def test_seeded_rows_are_reproducible_and_independent_of_the_batch():
    g = torch.Generator().manual_seed(9)
    flat = torch.randn(3, V, generator=g) * 0.3  # flat-ish: acceptance and recovery both vary
    drafts = [int(flat[0].argmax()), int(flat[1].argmax())]
    others = torch.randn(5, V, generator=g)
    results = set()
    for seed in range(12):
        p = SamplingParams(temperature=1.0, seed=seed)
        alone = _spec([p], [drafts], flat).token_id_lists()[0]
        batch = [SamplingParams(), SamplingParams(temperature=0.0), p, SamplingParams(seed=seed + 1, top_p=0.8)]
        logits = torch.cat([others[:2], others[2:3], flat, others[3:5]])  # rows with 1, 0, 2 and 1 drafts
        torch.manual_seed(seed)  # the unseeded row's draws differ from the first call's
        for on_device in (False, True):
            got = _spec(batch, [[3], [], drafts, [5]], logits, layout_on_device=on_device).token_id_lists()
            assert got[2] == alone, (seed, got, alone)
        results.add(tuple(alone))
    assert len(results) > 3, "the seeds should give different tokens"


def test_layout_on_the_device_gives_the_same_tokens():
    g = torch.Generator().manual_seed(2)
    drafts = [[1, 2, 3], [], [4], [5, 6]]
    params = [SamplingParams(seed=1), SamplingParams(temperature=0.0), SamplingParams(seed=2, top_p=0.8),
              SamplingParams(temperature=0.0, presence_penalty=1.0)]
    logits = torch.randn(sum(len(d) + 1 for d in drafts), V, generator=g)
    probs = torch.softmax(torch.randn(6, V, generator=g), dim=-1)
    for draft_probs in (None, probs):
        a = _spec(params, drafts, logits, draft_probs)
        b = _spec(params, drafts, logits, draft_probs, layout_on_device=True)
        assert a.token_id_lists() == b.token_id_lists()
        assert torch.equal(a.emitted, b.emitted) and torch.equal(a.num_drafts, b.num_drafts)
        assert a.last_token_ids.tolist() == b.last_token_ids.tolist() == [t[-1] for t in a.token_id_lists()]


def test_no_host_read_inside(monkeypatch):
    """With the drafts' layout on the device, nothing inside reads a tensor back to the host (on a GPU: no
    synchronization per step, let alone per row)."""
    g = torch.Generator().manual_seed(12)
    drafts = [[1, 2, 3], [], [4], [5, 6]]
    params = [SamplingParams(seed=1, logprobs=2), SamplingParams(temperature=0.0), SamplingParams(top_p=0.8),
              SamplingParams(temperature=0.0, presence_penalty=1.0, allowed_token_ids=[1, 2, 5, 6])]
    logits = torch.randn(sum(len(d) + 1 for d in drafts), V, generator=g)
    md = build_spec_sampling_metadata(params, [[]] * 4, [[]] * 4, drafts, EOS, "cpu", V)
    num, ids = torch.tensor([3, 0, 1, 2]), torch.tensor([1, 2, 3, 4, 5, 6])
    probs = torch.softmax(torch.randn(6, V, generator=g), dim=-1)

    def boom(*a, **k):
        raise AssertionError("a host read inside rejection_sample")

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    outs = [rejection_sample(logits, num, ids, p, md) for p in (None, probs)]
    monkeypatch.undo()
    for out in outs:
        assert out.emitted.sum().item() == out.num_accepted.sum().item() + 4


# ------------------------------------------------------------------ penalties, grammar, logprobs


def test_penalties_count_the_drafts_before_each_position():
    logits = torch.zeros(6, V)
    logits[:, 5], logits[:, 3] = 1.0, 0.5  # 5 wins until penalized past 3
    params = [SamplingParams(temperature=0.0, frequency_penalty=0.3)] * 2
    drafts = [[5, 5, 5], [5]]
    # row 0: 5 at offsets 0 and 1 (1.0, 0.7 > 0.5), at offset 2 it has 0.4 < 0.5: 3; row 1 (its own count): 5, 5
    want = [[5, 5, 3], [5, 5]]
    assert _spec(params, drafts, logits).token_id_lists() == want
    counts = torch.zeros(2, V)
    on_device = _spec(params, drafts, logits, penalty_tensors=(counts, None))
    assert on_device.token_id_lists() == want
    # the runner's device counts (a token generated before) shift every position
    counts[1, 5] = 1.0
    assert _spec(params, drafts, logits, penalty_tensors=(counts, None)).token_id_lists() == [[5, 5, 3], [5, 3]]
    # presence penalty over an earlier output: the first position already avoids 5
    pres = [SamplingParams(temperature=0.0, presence_penalty=2.0)]
    assert _spec(pres, [[5, 5]], logits[:3]).token_id_lists() == [[5, 3]]
    assert _spec(pres, [[5, 5]], logits[:3], outputs=[[5]]).token_id_lists() == [[3]]


def test_penalty_tensors_expand_to_the_host_counts():
    params = [SamplingParams(frequency_penalty=0.5, repetition_penalty=1.3), SamplingParams(temperature=0.0),
              SamplingParams(presence_penalty=0.2)]
    prompts = [[1, 1, 4], [2], [9, 10]]
    outputs = [[3, 3], [7], []]
    drafts = [[3, 6, 3], [], [9, 9]]
    host = build_spec_sampling_metadata(params, prompts, outputs, drafts, EOS, "cpu", V)
    counts = torch.zeros(3, V)
    mask = torch.zeros(3, V, dtype=torch.bool)
    for r in range(3):
        counts[r].index_add_(0, torch.tensor(outputs[r], dtype=torch.int64), torch.ones(len(outputs[r])))
        mask[r, prompts[r]] = True
    device = build_spec_sampling_metadata(params, prompts, outputs, drafts, EOS, "cpu", V,
                                          penalty_tensors=(counts, mask))
    # the host path counts only the rows that have a penalty; the device path counts every row
    penalized = torch.tensor([0, 1, 2, 3, 5, 6, 7])  # the positions of rows 0 and 2
    assert torch.equal(host.output_counts[penalized], device.output_counts[penalized])
    assert torch.equal(host.prompt_mask[penalized[:4]], device.prompt_mask[penalized[:4]])


def test_penalty_state_records_the_emitted_tokens_of_a_speculative_step():
    state = PenaltyState(V, torch.device("cpu"))
    state.add(10, [1, 2], [3])
    state.add(30, None, [])
    params = [SamplingParams(temperature=0.0, frequency_penalty=0.1), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0, presence_penalty=0.1)]
    drafts = [[4, 6, 1], [2], [2, 7]]
    logits = torch.zeros(9, V)
    logits[torch.arange(9), torch.tensor([4, 6, 1, 9, 2, 5, 2, 3, 8])] = 5.0
    seq_ids = [10, 20, 30]  # 20 has no penalties and no row
    out = _spec(params, drafts, logits, penalty_tensors=state.gather(seq_ids))
    tokens = out.token_id_lists()
    assert tokens == [[4, 6, 1, 9], [2, 5], [2, 3]]
    state.record(seq_ids, out.sampled_token_ids, [len(d) for d in drafts], out.emitted)
    counts, _ = state.gather([10, 30])
    want = torch.zeros(2, V)
    for r, toks in enumerate([[3] + tokens[0], tokens[2]]):
        want[r].index_add_(0, torch.tensor(toks), torch.ones(len(toks)))
    assert torch.equal(counts, want)
    state.check_integrity()


def _bitmask(allowed: list[int]) -> torch.Tensor:
    words = torch.zeros(1, (V + 31) // 32, dtype=torch.int64)
    for t in allowed:
        words[0, t // 32] |= 1 << (t % 32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # [1, W] int32 bit pattern


@pytest.mark.parametrize("triton", [False, pytest.param(True, marks=[
    pytest.mark.triton, pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                           reason="CPU tensors through the Triton interpreter")])])
def test_grammar_bitmask_masks_a_draft_position(triton):
    logits = torch.zeros(3, V)
    logits[0, 4] = logits[1, 6] = logits[2, 2] = 5.0
    logits[1, 8] = 3.0  # the best token the grammar allows at offset 1
    greedy = [SamplingParams(temperature=0.0)]
    assert _spec(greedy, [[4, 6]], logits).token_id_lists() == [[4, 6, 2]]
    no_six = _bitmask([t for t in range(V) if t != 6])
    assert _spec(greedy, [[4, 6]], logits, grammar=([1], no_six), triton=triton).token_id_lists() == [[4, 8]]
    # random rows: a masked draft is never accepted, and the token drawn instead is one the grammar allows
    n = 300
    allowed = [0, 1, 2, 3, 4, 5]
    mask = _bitmask(allowed).repeat(n, 1)
    out = _spec([SamplingParams()] * n, [[6, 4]] * n, logits.repeat(n, 1),
                grammar=(list(range(0, 3 * n, 3)), mask), triton=triton)  # the first position of every row
    assert out.num_accepted.sum().item() == 0
    assert set(out.sampled_token_ids.view(n, 3)[:, 0].tolist()) <= set(allowed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_equal_the_plain_samplers_at_each_position(dtype):
    g = torch.Generator().manual_seed(6)
    params = [SamplingParams(temperature=0.0, logprobs=3), SamplingParams(seed=4, logprobs=2),
              SamplingParams(temperature=0.0)]
    drafts = [[0, 1], [2, 3, 4], [5]]
    logits = (torch.randn(9, V, generator=g) * 2).to(dtype)
    logits[0, 0] = logits[1, 1] = 9.0  # row 0's drafts are accepted: three emitted positions
    out = _spec(params, drafts, logits)
    tokens = out.token_id_lists()
    assert len(tokens[0]) == 3
    start = 0
    for r, p in enumerate(params):
        for j, token in enumerate(tokens[r]):
            pos = start + j
            # the plain sampler at that position, asked for this token's logprob and the top alternatives
            asked = SamplingParams(temperature=0.0, logprob_token_ids=[token])
            plain = _plain_token(asked, logits[pos], output=drafts[r][:j])
            assert out.logprobs[pos].item() == plain.token_id_logprobs[0, 0].item()
            if p.temperature == 0.0:
                assert token == plain.sampled_token_ids.item()
            top = _plain_token(SamplingParams(temperature=0.0, logprobs=3), logits[pos])
            assert torch.equal(out.top_logprobs[pos], top.top_logprobs[0])
            assert torch.equal(out.top_logprobs_ids[pos], top.top_logprobs_ids[0])
        start += len(drafts[r]) + 1


# ------------------------------------------------------------------ bad arguments


def test_bad_arguments_name_the_parameter():
    params = [SamplingParams(temperature=0.0)] * 2
    drafts = [[1], [2, 3]]
    logits = torch.zeros(5, V)
    md = build_spec_sampling_metadata(params, [[], []], [[], []], drafts, EOS, "cpu", V)
    ids = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="num_drafts"):
        rejection_sample(logits, [1, 1], ids, None, md)
    with pytest.raises(ValueError, match="draft_token_ids"):
        rejection_sample(logits, [1, 2], ids[:2], None, md)
    with pytest.raises(ValueError, match="draft_probs"):
        rejection_sample(logits, [1, 2], ids, torch.zeros(3, V + 1), md)
    with pytest.raises(ValueError, match="one row per position"):
        rejection_sample(logits, [1, 2], ids, None, build_sampling_metadata(params, [[], []], [[], []], EOS, "cpu", V))
    with pytest.raises(ValueError, match="draft_token_ids"):
        build_spec_sampling_metadata(params, [[], []], [[], []], drafts[:1], EOS, "cpu", V)
