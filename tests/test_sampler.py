"""Batched sampler: greedy fast path, filtered distributions (statistically), per-request seeds,
penalties, min_tokens and logprobs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.sample.logits_processors import apply_penalties
from minivllm.sample.metadata import build_sampling_metadata
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams
from tests.helpers.sampler_reference import filtered_probs

V = 50
EOS = [7, 11]
sampler = Sampler()


def _logits(seed: int, rows: int = 1, vocab: int = V, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * scale


def _meta(params, logits, prompts=None, outputs=None, eos=EOS, generator=None):
    B, vocab = logits.shape
    prompts = prompts if prompts is not None else [[] for _ in range(B)]
    outputs = outputs if outputs is not None else [[] for _ in range(B)]
    return build_sampling_metadata(params, prompts, outputs, eos, logits.device, vocab, generator=generator)


def _sample(params, logits, **kw):
    return sampler(logits, _meta(params, logits, **kw))


# ------------------------------------------------------------------ greedy


def test_temperature_zero_and_top_k_one_give_argmax():
    logits = _logits(0, rows=12)
    expected = logits.argmax(-1)
    params = [
        SamplingParams(temperature=0.0) if i % 3 == 0 else SamplingParams(temperature=1.3, top_k=1)
        if i % 3 == 1 else SamplingParams(temperature=0.0, top_p=0.5, seed=i)
        for i in range(12)
    ]  # fmt: skip
    for _ in range(5):
        assert torch.equal(_sample(params, logits).sampled_token_ids, expected)
    # a mixed batch: greedy rows stay argmax, random rows are free
    mixed = [SamplingParams(temperature=0.0 if i % 2 else 5.0) for i in range(12)]
    out = _sample(mixed, logits).sampled_token_ids
    assert torch.equal(out[1::2], expected[1::2])


def _forbid(monkeypatch, *names):
    def boom(*a, **k):
        raise AssertionError("hot path must not call this")

    for name in names:
        owner, attr = name.rsplit(".", 1)
        monkeypatch.setattr(torch.Tensor if owner == "Tensor" else torch, attr, boom)


def test_all_greedy_batch_does_argmax_only(monkeypatch):
    logits = _logits(1, rows=8).to(torch.bfloat16)
    expected = logits.argmax(-1)
    params = [SamplingParams(temperature=0.0) for _ in range(8)]
    md = _meta(params, logits)
    assert md.all_greedy and md.no_top_k and md.no_top_p and md.no_min_p and md.no_penalties
    assert md.max_num_logprobs is None and not md.any_seeded
    _forbid(
        monkeypatch, "torch.sort", "torch.topk", "torch.softmax", "torch.log_softmax", "torch.cumsum",
        "Tensor.sort", "Tensor.topk", "Tensor.softmax", "Tensor.exponential_", "Tensor.float",
    )  # fmt: skip
    out = sampler(logits, md)
    assert torch.equal(out.sampled_token_ids, expected) and out.sampled_token_ids.dtype == torch.int64
    assert out.logprobs is None and out.top_logprobs is None
    # greedy + penalties + min_tokens: still no sort / softmax / noise
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.5, min_tokens=2) for _ in range(8)]
    out = sampler(logits, _meta(params, logits, outputs=[[1, 2]] * 4 + [[3]] * 4))
    assert out.sampled_token_ids.shape == (8,)


def test_top_k_only_batch_does_not_sort(monkeypatch):
    logits = _logits(2, rows=4)
    _forbid(monkeypatch, "torch.sort", "Tensor.sort")
    out = _sample(
        [SamplingParams(top_k=3), SamplingParams(), SamplingParams(top_k=1), SamplingParams(min_p=0.2)],
        logits,
    )
    top3 = torch.topk(logits[0], 3).indices
    assert out.sampled_token_ids[0] in top3 and out.sampled_token_ids[2] == logits[2].argmax()


# ------------------------------------------------------------------ the filtered distributions

N = 50_000  # samples, drawn as N rows of one batch
# E[TVD] of N=50k samples is <= 0.5*sqrt(2*|support|/(pi*N)) ~ 0.0126 even for 50 equal tokens
TVD_BOUND = 0.02
PROMPT = [3, 3, 17, 40]
OUTPUT = [17, 5, 5, 5, 21]

CONFIGS = {
    "temperature": (dict(temperature=0.6), {}),
    "top_k": (dict(top_k=7), {}),
    "top_p": (dict(top_p=0.75), {}),
    "min_p": (dict(min_p=0.08), {}),
    "temp_top_k_top_p": (dict(temperature=1.4, top_k=20, top_p=0.85), {}),
    "top_p_min_p": (dict(temperature=0.8, top_p=0.9, min_p=0.05), {}),
    "all_filters_penalties": (
        dict(temperature=1.2, top_k=25, top_p=0.92, min_p=0.02, repetition_penalty=1.3,
             frequency_penalty=0.4, presence_penalty=0.3, min_tokens=8, stop_token_ids=[30]),
        dict(prompt=PROMPT, output=OUTPUT),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CONFIGS))
def test_empirical_distribution_matches_filtered_probs(name):
    kwargs, ctx = CONFIGS[name]
    params = SamplingParams(**kwargs)
    row = _logits(42, scale=1.5)[0]
    # make the argmax and the eos / stop ids likely, so that the masks matter
    row[EOS[0]] += 3.0
    row[30] += 2.5
    prompt, output = ctx.get("prompt", []), ctx.get("output", [])
    ref = filtered_probs(row, params, prompt, output, EOS)
    plain = torch.softmax(row.double(), 0)
    assert abs(ref.sum().item() - 1) < 1e-9
    assert 0.5 * (ref - plain).abs().sum() > 0.05, "the test could not tell the filter from no filter"
    if params.top_p < 1:  # the top-p boundary is not a float32 coin flip
        q = filtered_probs(row, SamplingParams(**{**kwargs, "top_p": 1.0, "min_p": 0.0}), prompt, output, EOS)
        before = torch.cumsum(q.sort(descending=True).values, 0) - q.sort(descending=True).values
        assert (before - params.top_p).abs().min() > 1e-4

    logits = row.expand(N, V).contiguous()
    md = _meta([params] * N, logits, prompts=[prompt] * N, outputs=[output] * N,
               generator=torch.Generator().manual_seed(1234))  # fmt: skip
    tokens = sampler(logits, md).sampled_token_ids
    counts = torch.bincount(tokens, minlength=V).double()
    empirical = counts / N
    assert counts[ref == 0].sum() == 0, "sampled a token outside the filtered support"
    tvd = 0.5 * (empirical - ref).abs().sum().item()
    print(f"{name}: support {int((ref > 0).sum())}/{V}, TVD {tvd:.4f}")
    assert tvd < TVD_BOUND, f"{name}: TVD {tvd:.4f}"


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    rows=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.3, 1.0, 2.0]),  # temperature
            st.sampled_from([-1, 1, 2, 5, 49, 60]),  # top_k
            st.sampled_from([1.0, 0.9, 0.5, 0.05]),  # top_p
            st.sampled_from([0.0, 0.1, 0.5, 1.0]),  # min_p
            st.sampled_from([None, 0, 1]),  # seed
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_samples_stay_in_filtered_support(seed, rows):
    """Any per-row mix of filters: every sampled token has positive filtered probability."""
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m, seed=s) for t, k, p, m, s in rows]
    base = _logits(seed, rows=len(params))
    reps = 64
    logits = base.repeat_interleave(reps, 0)
    out = _sample([p for p in params for _ in range(reps)], logits).sampled_token_ids.view(len(params), reps)
    for i, p in enumerate(params):
        support = filtered_probs(base[i], p) > 0
        assert support[out[i]].all(), (p, out[i])


# ------------------------------------------------------------------ seeds


def _generate(rows_params, rows_logits, steps=20, target=None):
    """Run `steps` decode steps; each row appends its own token (as the engine would)."""
    outputs = [[] for _ in rows_params]
    logits = torch.stack(rows_logits)
    for _ in range(steps):
        md = _meta(rows_params, logits, outputs=outputs)
        toks = sampler(logits, md).sampled_token_ids.tolist()
        for o, t in zip(outputs, toks, strict=True):
            o.append(t)
    return outputs if target is None else outputs[target]


def test_seeded_request_is_independent_of_the_batch():
    flat = _logits(5, scale=0.3)[0]  # flat-ish: many tokens are likely at every step
    p = SamplingParams(temperature=1.0, seed=1234)
    alone = _generate([p], [flat], target=0)
    assert len(set(alone)) > 5
    others = _logits(6, rows=4, scale=0.3)
    batch_params = [SamplingParams(), SamplingParams(seed=99, top_p=0.9), p, SamplingParams(temperature=0.0),
                    SamplingParams(temperature=0.7, seed=1234)]  # fmt: skip
    batch_logits = [others[0], others[1], flat, others[2], others[3]]
    assert _generate(batch_params, batch_logits, target=2) == alone
    assert _generate(batch_params[::-1], batch_logits[::-1], target=2) == alone  # other position
    # preemption / recompute: the token of step s depends only on (seed, s)
    outputs = [alone[:7]]
    md = _meta([p], flat[None], outputs=outputs)
    assert sampler(flat[None], md).sampled_token_ids.item() == alone[7]
    # different seeds, different sequences
    seqs = {tuple(_generate([SamplingParams(seed=s)], [flat], target=0)) for s in range(6)}
    assert len(seqs) == 6
    # unseeded rows are not frozen
    free = {tuple(_generate([SamplingParams()], [flat], target=0)) for _ in range(3)}
    assert len(free) == 3


# ------------------------------------------------------------------ penalties


def test_penalties_match_hand_computed_logits():
    logits = torch.tensor(
        [
            [2.0, -1.0, 0.5, 3.0, -2.0, 0.0],
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            [0.0, 1.0, -1.0, 0.0, 2.0, 0.0],
        ]
    )
    params = [
        SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
        SamplingParams(),
        SamplingParams(presence_penalty=-1.0, frequency_penalty=0.1),
    ]
    prompts = [[0, 1, 5], [0, 1, 2], [4]]
    outputs = [[2, 2, 4], [3], [5, 5, 2]]
    md = _meta(params, logits, prompts=prompts, outputs=outputs)
    assert not md.no_penalties
    got = apply_penalties(logits.clone(), md)
    # row 0: seen = {0, 1, 5} u {2, 4}; rep: l>0 -> l/2, l<=0 -> l*2; then -0.5*count -0.25*(count>0)
    #   t0: 2/2 = 1;  t1: -1*2 = -2;  t2: 0.5/2 - 0.5*2 - 0.25 = -1.0;  t3: 3 (unseen)
    #   t4: -2*2 - 0.5*1 - 0.25 = -4.75;  t5: 0*2 = 0
    # row 1: no penalties
    # row 2: no repetition penalty (prompt ignored); t5: 0 - 0.1*2 + 1 = 0.8;  t2: -1 - 0.1 + 1 = -0.1
    expected = torch.tensor(
        [
            [1.0, -2.0, -1.0, 3.0, -4.75, 0.0],
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            [0.0, 1.0, -0.1, 0.0, 2.0, 0.8],
        ]
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    # the reference helper agrees with the batched implementation
    for i in range(3):
        ref = filtered_probs(logits[i], params[i], prompts[i], outputs[i])
        torch.testing.assert_close(ref, torch.softmax(expected[i].double(), 0), rtol=0, atol=1e-6)
    # and a greedy row samples the argmax of the penalized logits
    greedy = [SamplingParams(temperature=0.0, repetition_penalty=10.0)]
    assert _sample(greedy, logits[1:2], prompts=[[5]], outputs=[[4]]).sampled_token_ids.item() == 3


# ------------------------------------------------------------------ min_tokens


def test_min_tokens_masks_eos_and_stop_token_ids():
    logits = torch.zeros(6, V)
    logits[:, EOS[0]] = 30.0  # eos (then eos2, then the stop id) dominate every row
    logits[:, EOS[1]] = 29.0
    logits[:, 30] = 28.0
    logits[:, 3] = 5.0
    greedy = dict(temperature=0.0)
    params = [
        SamplingParams(min_tokens=3, stop_token_ids=[30], **greedy),  # 1 token so far: masked
        SamplingParams(min_tokens=3, stop_token_ids=[30], **greedy),  # 3 tokens so far: free
        SamplingParams(min_tokens=3, stop_token_ids=[30], ignore_eos=True, **greedy),  # eos free, 30 masked
        SamplingParams(min_tokens=2, stop_token_ids=[30], ignore_eos=True, **greedy),
        SamplingParams(min_tokens=5, stop_token_ids=[30], temperature=1.0),  # random row, masked
        SamplingParams(min_tokens=5, temperature=1.0, seed=3),
    ]
    outputs = [[1], [1, 2, 3], [1], [1], [1, 2], [1]]
    for _ in range(3):
        toks = _sample(params, logits, outputs=outputs).sampled_token_ids.tolist()
        assert toks[0] == 3 and toks[1] == EOS[0] and toks[2] == EOS[0] and toks[3] == EOS[0]
        assert toks[4] not in (*EOS, 30)
        assert toks[5] == 30  # no stop_token_ids: only the eos ids are masked
    # per-row eos lists are accepted too
    toks = _sample(params[:2], logits[:2], outputs=outputs[:2], eos=[[EOS[0]], [EOS[1]]]).sampled_token_ids
    assert toks.tolist() == [EOS[1], EOS[0]]


# ------------------------------------------------------------------ logprobs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_are_raw_log_softmax(dtype):
    logits = _logits(9, rows=10).to(dtype)
    params = [
        SamplingParams(temperature=0.5, top_k=5, repetition_penalty=1.5, logprobs=3),
        SamplingParams(temperature=0.0, logprobs=0),
        SamplingParams(top_p=0.3, presence_penalty=1.0),
        SamplingParams(min_p=0.1, logprobs=5, seed=1),
    ] + [SamplingParams(temperature=0.9, frequency_penalty=0.5)] * 6
    outputs = [[1, 2, 3]] * 10
    out = _sample(params, logits, prompts=[[4, 5]] * 10, outputs=outputs)
    raw = torch.log_softmax(logits.float(), dim=-1)
    ids = out.sampled_token_ids
    torch.testing.assert_close(out.logprobs, raw.gather(1, ids[:, None])[:, 0])
    assert out.logprobs.dtype == torch.float32
    assert out.top_logprobs.shape == out.top_logprobs_ids.shape == (10, 5)
    assert (out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:]).all()
    torch.testing.assert_close(out.top_logprobs, raw.gather(1, out.top_logprobs_ids))
    torch.testing.assert_close(out.top_logprobs, raw.topk(5, dim=-1).values)
    assert ids[1] == logits[1].float().argmax()
    # logprobs=0 only: the sampled token's logprob, no alternatives; none asked: nothing
    out = _sample([SamplingParams(logprobs=0)] * 2, logits[:2])
    assert out.logprobs is not None and out.top_logprobs is None and out.top_logprobs_ids is None
    out = _sample([SamplingParams()] * 2, logits[:2])
    assert out.logprobs is None and out.top_logprobs is None


# ------------------------------------------------------------------ devices


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_bf16_logits_and_generators_on_the_logits_device(device):
    """bf16 logits: a seeded request's generator lives on the logits' device, and its token is the same alone
    and in a batch beside other rows."""
    dev = torch.device(device)
    flat = (_logits(5, scale=0.3)[0]).to(dev, torch.bfloat16)
    p = SamplingParams(seed=77, top_p=0.95, top_k=40, repetition_penalty=1.1, logprobs=2)
    md = build_sampling_metadata([p], [[1]], [[2]], EOS, dev, V)
    assert md.seeded[0][1].device.type == device
    alone = sampler(flat[None], md).sampled_token_ids
    batch = torch.stack([flat, _logits(1)[0].to(dev, torch.bfloat16), flat])
    params = [SamplingParams(), SamplingParams(temperature=0.0), p]
    md = build_sampling_metadata(params, [[1]] * 3, [[2]] * 3, EOS, dev, V)
    out = sampler(batch, md)
    assert out.sampled_token_ids.device.type == device
    assert out.sampled_token_ids[2].item() == alone.item()
