"""Speculative decoding with the n-gram proposer through the whole engine (CPU, float32): lossless.

Greedy outputs equal the non-speculative engine's token for token (whose outputs are checked against
transformers elsewhere), on the demo model and a tiny random Qwen3 checkpoint, and so do seeded random ones (each
draft position is sampled with the key of the output index it stands for), with every feature that reads or ends
a sequence: stop ids and strings, penalties, logprobs, n > 1, min_tokens, max_model_len, structured outputs,
prefix-cache hits, chunked prefill, preemption and asynchronous scheduling. Every test asserts that drafts were
accepted, so none passes with speculation silently off.
"""

import re

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.structured_outputs_params import StructuredOutputsParams
from tests.helpers.spec_decode_checks import (
    DEMO_MODEL,
    NGRAM,
    REPETITIVE_PROMPTS,
    assert_same_outputs,
    feature_params,
)

GREEDY_64 = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)


def spec_llm(model, spec=NGRAM, **kw) -> LLM:
    return LLM(model, device="cpu", speculative_config=spec, **kw)


@pytest.mark.parametrize("model", ["demo", "tiny"])
def test_greedy_outputs_equal_no_speculation(model, tiny_tied_model):
    path = DEMO_MODEL if model == "demo" else tiny_tied_model
    assert len(REPETITIVE_PROMPTS) >= 16
    expected = LLM(path, device="cpu").generate(REPETITIVE_PROMPTS, GREEDY_64, use_tqdm=False)
    llm = spec_llm(path)
    got = llm.generate(REPETITIVE_PROMPTS, GREEDY_64, use_tqdm=False)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
    assert all(len(o["token_ids"]) == 64 for o in got)
    totals = llm.engine.spec_totals
    assert totals.num_accepted_tokens > 0 and totals.num_draft_tokens >= totals.num_accepted_tokens
    assert sum(totals.per_pos) == totals.num_accepted_tokens and totals.per_pos[0] >= totals.per_pos[-1]
    assert 1.0 < totals.mean_acceptance_length <= 1 + NGRAM["num_speculative_tokens"]


@pytest.fixture(scope="module")
def references():
    """``(params, outputs without speculation, outputs with it)`` of the feature requests, max_model_len 160."""
    base = LLM(DEMO_MODEL, device="cpu", max_model_len=160)
    params = feature_params(base)
    prompts = REPETITIVE_PROMPTS[:len(params)]
    return params, base.generate(prompts, params, use_tqdm=False), spec_llm(DEMO_MODEL, max_model_len=160).generate(
        prompts, params, use_tqdm=False)


@pytest.mark.parametrize("kw", [
    dict(),
    pytest.param(dict(num_kvcache_blocks=12), marks=pytest.mark.slow),  # preemption
    pytest.param(dict(max_num_batched_tokens=16, num_kvcache_blocks=14), marks=pytest.mark.slow),  # chunked
    pytest.param(dict(async_scheduling=True), marks=pytest.mark.slow),
], ids=["plain", "preemption", "chunked", "async"])
def test_every_feature_equals_no_speculation(references, kw):
    """Greedy requests give the tokens of no speculation. Seeded random ones draw other tokens than the plain
    sampler (rejection sampling makes its own draws) but are reproducible given the same drafts: where neither the
    budget nor the blocks cut a row's drafts (NOTE: preemption and a tight budget do), they equal the reference
    run's."""
    params, expected, spec_reference = references
    llm = spec_llm(DEMO_MODEL, max_model_len=160, **kw)
    got = llm.generate(REPETITIVE_PROMPTS[:len(params)], params, use_tqdm=False)
    greedy = [i for i, p in enumerate(params) if p.temperature == 0]
    assert 0 < len(greedy) < len(params)
    if "max_num_batched_tokens" in kw:  # prompt logprobs computed in other chunks: equal to float32 rounding
        for g, e in zip(got, expected):
            for a, b in zip(g.pop("prompt_logprobs", None) or [], e.get("prompt_logprobs") or [], strict=True):
                assert (a is None and b is None) or all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in b)
        expected = [{k: v for k, v in e.items() if k != "prompt_logprobs"} for e in expected]
    assert_same_outputs([got[i] for i in greedy], [expected[i] for i in greedy])
    if "num_kvcache_blocks" not in kw:
        assert_same_outputs(got, spec_reference)
    else:
        assert all(len(o["token_ids"]) > 0 and o["finish_reason"] for o in got)
    assert llm.engine.spec_totals.num_accepted_tokens > 0
    assert llm.engine.block_manager.num_used_blocks == 0
    llm.engine.scheduler.check_integrity()


def test_prefix_cache_hits_equal_no_speculation():
    prompts = REPETITIVE_PROMPTS[:6]
    base = LLM(DEMO_MODEL, device="cpu")
    expected = base.generate(prompts, GREEDY_64, use_tqdm=False)
    llm = spec_llm(DEMO_MODEL)
    first = llm.generate(prompts, GREEDY_64, use_tqdm=False)
    hits_before = llm.engine.block_manager.num_cached_blocks
    again = llm.generate(prompts, GREEDY_64, use_tqdm=False)  # every prompt's full blocks hit now
    assert hits_before > 0
    for out in (first, again):
        assert [o["token_ids"] for o in out] == [o["token_ids"] for o in expected]
    assert llm.engine.spec_totals.num_accepted_tokens > 0


@pytest.mark.slow
def test_preemption_happens_and_outputs_equal():
    kw = dict(max_model_len=160, num_kvcache_blocks=12)
    expected = LLM(DEMO_MODEL, device="cpu", **kw).generate(REPETITIVE_PROMPTS[:8], GREEDY_64, use_tqdm=False)
    llm = spec_llm(DEMO_MODEL, **kw)
    engine = llm.engine
    ids = [engine.add_request(p, GREEDY_64) for p in REPETITIVE_PROMPTS[:8]]
    done, preempted = {}, 0
    while engine.has_unfinished_requests():
        outputs, stats = engine.step()
        preempted += stats.num_preempted
        engine.scheduler.check_integrity()
        done.update((o.request_id, o) for o in outputs if o.finished)
    assert preempted > 0 and engine.spec_totals.num_accepted_tokens > 0
    assert [done[i].outputs[0].token_ids for i in ids] == [o["token_ids"] for o in expected]


def test_structured_outputs_stay_valid_and_equal():
    """Rows under a grammar draft too: each draft position is masked by the grammar advanced over the drafts
    before it, and the grammar advances over the accepted tokens."""
    regex = r"(def [a-z_]+\(\):\n    return [0-9]+\n){2}"
    repeat = r"(x = [0-9]\n){6}"
    so = StructuredOutputsParams
    params = [SamplingParams(temperature=0, max_tokens=60, structured_outputs=so(regex=regex)),
              GREEDY_64, SamplingParams(temperature=0, max_tokens=60, structured_outputs=so(regex=repeat)),
              SamplingParams(temperature=0, max_tokens=40, structured_outputs=so(choice=["yes", "no"])),
              SamplingParams(temperature=0.8, seed=1, max_tokens=60, structured_outputs=so(regex=repeat))]
    prompts = REPETITIVE_PROMPTS[:5]
    expected = LLM(DEMO_MODEL, device="cpu").generate(prompts, params, use_tqdm=False)
    llm = spec_llm(DEMO_MODEL)
    got = llm.generate(prompts, params, use_tqdm=False)
    assert_same_outputs(got[:4], expected[:4])
    assert re.fullmatch(regex, got[0]["text"]) and got[3]["text"] in ("yes", "no")
    for out in (got[2], got[4]):
        assert re.fullmatch(repeat, out["text"]) and out["finish_reason"] == "stop"
    # constrained rows alone: their drafts are verified and accepted
    before = llm.engine.spec_totals.copy()
    again = llm.generate(prompts[2:3], params[2:3], use_tqdm=False)
    assert again[0]["token_ids"] == expected[2]["token_ids"]
    assert llm.engine.spec_totals.since(before).num_accepted_tokens > 0


def test_step_stats_carry_the_counters():
    llm = spec_llm(DEMO_MODEL)
    engine = llm.engine
    for p in REPETITIVE_PROMPTS[:4]:
        engine.add_request(p, GREEDY_64)
    drafts = draft_tokens = accepted = 0
    per_pos = [0] * NGRAM["num_speculative_tokens"]
    while engine.has_unfinished_requests():
        _, stats = engine.step()
        drafts += stats.spec_num_drafts
        draft_tokens += stats.spec_num_draft_tokens
        accepted += stats.spec_num_accepted_tokens
        for i, n in enumerate(stats.spec_accepted_per_pos):
            per_pos[i] += n
    t = engine.spec_totals
    assert (drafts, draft_tokens, accepted, per_pos) == (t.num_drafts, t.num_draft_tokens, t.num_accepted_tokens,
                                                          t.per_pos)
    assert accepted > 0


def test_disable_by_batch_size_turns_drafts_off_for_large_batches():
    # eight requests that all end together: the batch never shrinks to one
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    expected = LLM(DEMO_MODEL, device="cpu").generate(REPETITIVE_PROMPTS[:8], params, use_tqdm=False)
    llm = spec_llm(DEMO_MODEL, {**NGRAM, "disable_by_batch_size": 4})
    got = llm.generate(REPETITIVE_PROMPTS[:8], params, use_tqdm=False)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
    assert llm.engine.spec_totals.num_drafts == 0
    llm.generate(REPETITIVE_PROMPTS[:2], params, use_tqdm=False)  # two rows: at most 4
    assert llm.engine.spec_totals.num_drafts > 0


def test_bad_speculative_config_is_a_value_error():
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(DEMO_MODEL, device="cpu", speculative_config={"method": "ngram"})
    with pytest.raises(ValueError, match="speculative_config.method"):
        LLM(DEMO_MODEL, device="cpu", speculative_config='{"method": "medusa", "num_speculative_tokens": 2}')
    with pytest.raises(ValueError, match="speculative_config: unknown key"):
        LLM(DEMO_MODEL, device="cpu", speculative_config={"method": "ngram", "num_speculative_tokens": 2, "k": 1})


@pytest.mark.slow
def test_tensor_parallel_equals_no_speculation():
    """TP=2 over gloo: rank 0 verifies and proposes; the drafts reach the other rank in each row's tokens."""
    import torch

    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected = LLM(DEMO_MODEL, device="cpu").generate(REPETITIVE_PROMPTS[:6], params, use_tqdm=False)
        with spec_llm(DEMO_MODEL, tensor_parallel_size=2, max_model_len=256) as llm:
            got = llm.generate(REPETITIVE_PROMPTS[:6], params, use_tqdm=False)
            accepted = llm.engine.spec_totals.num_accepted_tokens
    finally:
        torch.set_num_threads(prev)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
    assert accepted > 0


@pytest.mark.triton
@pytest.mark.slow
def test_triton_attention_verifies_several_query_tokens_per_decode_row(tiny_tied_model):
    """The Triton backend (in the interpreter) computes a row's newest token and its drafts as one chunk over its
    cached context, with the fused sampler's kernels: the torch backend's greedy tokens."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = REPETITIVE_PROMPTS[:3]
    with LLM(tiny_tied_model, device="cpu") as llm:
        expected = llm.generate(prompts, params, use_tqdm=False)
    with spec_llm(tiny_tied_model, attention_backend="triton") as tri:
        got = tri.generate(prompts, params, use_tqdm=False)
        totals = tri.engine.spec_totals
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
    assert totals.num_draft_tokens > 0


def test_abort_while_a_draft_step_is_in_flight():
    """Asynchronous scheduling: a step with drafts is in flight when a request is aborted; the others go on to
    the tokens of no speculation and every block comes back."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = REPETITIVE_PROMPTS[:3]
    expected = LLM(DEMO_MODEL, device="cpu").generate(prompts, params, use_tqdm=False)
    engine = spec_llm(DEMO_MODEL, async_scheduling=True).engine
    ids = [engine.add_request(p, params, stream=True) for p in prompts]
    tokens = {rid: [] for rid in ids}
    for _ in range(40):  # until the step in flight verifies drafts
        for o in engine.step()[0]:
            tokens[o.request_id] += o.outputs[0].delta_token_ids
        if engine._in_flight is not None and engine._in_flight.sched.num_draft_tokens:
            break
    assert engine._in_flight.sched.num_draft_tokens > 0
    engine.abort_request(ids[1])
    while engine.has_unfinished_requests():
        for o in engine.step()[0]:
            tokens[o.request_id] += o.outputs[0].delta_token_ids
        engine.scheduler.check_integrity()
    assert [tokens[ids[0]], tokens[ids[2]]] == [expected[0]["token_ids"], expected[2]["token_ids"]]
    assert tokens[ids[1]] == expected[1]["token_ids"][:len(tokens[ids[1]])]
    assert engine.block_manager.num_used_blocks == 0


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma3", "moe"])
def test_other_model_families_equal_no_speculation(family, tiny_moe_model, tmp_path):
    """Gemma 3 (sliding-window layers: two KV cache groups, each reserving the drafts' slots) and a Qwen3-MoE,
    with chunked prefill and a small cache."""
    from tests.helpers.gemma3_checkpoints import build_gemma3_checkpoint

    path = str(build_gemma3_checkpoint(tmp_path / "g")) if family == "gemma3" else tiny_moe_model
    prompts = [[(7 * i + 3 * j) % 50 + 3 for j in range(20 + 9 * i)] for i in range(6)]
    prompts += [[5, 6, 7, 8] * 10, [9, 10, 11] * 12]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    kw = dict(max_num_batched_tokens=32, num_kvcache_blocks=24, max_model_len=160)
    expected = LLM(path, device="cpu", **kw).generate(prompts, params, use_tqdm=False)
    llm = spec_llm(path, **kw)
    got = llm.generate(prompts, params, use_tqdm=False)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
    assert llm.engine.spec_totals.num_accepted_tokens > 0
    llm.engine.scheduler.check_integrity()


class _SampledNgram:
    """A proposer that claims its n-gram drafts were drawn from a spread distribution (half its mass on the
    draft): verification must then use those probabilities."""

    hidden_state_layers = ()

    def __init__(self, vocab_size: int):
        from minivllm.spec_decode.ngram_drafter import NgramDrafter

        self.inner = NgramDrafter(NGRAM["num_speculative_tokens"], 2, 4)
        self.num_speculative_tokens = self.inner.num_speculative_tokens
        self.vocab_size = vocab_size
        self.calls = 0

    def propose(self, inputs):
        from minivllm.spec_decode.proposer import DraftProposal

        drafts, num, _ = self.inner.propose(inputs)
        probs = torch.full((*drafts.shape, self.vocab_size), 0.5 / self.vocab_size)  # [rows, k, V]
        probs.scatter_add_(2, torch.from_numpy(drafts).long().unsqueeze(2), torch.full((*drafts.shape, 1), 0.5))
        self.calls += 1
        return DraftProposal(drafts, num, probs)

    def remove(self, seq_ids):
        pass


def test_draft_probabilities_reach_verification(monkeypatch):
    """A proposer's draft distributions reach rejection sampling, row by row (a row's first drafts when the
    scheduler cut them); greedy rows stay exact and seeded runs reproducible."""
    from minivllm.worker import model_runner, spec_decode

    made, seen = [], []

    def build(spec, *args):
        made.append(_SampledNgram(4032))
        return made[-1]

    def recording(logits, num_drafts, draft_token_ids, draft_probs, md, **kw):
        seen.append((list(num_drafts), draft_token_ids.clone(), None if draft_probs is None else draft_probs.clone()))
        return real(logits, num_drafts, draft_token_ids, draft_probs, md, **kw)

    real = spec_decode.rejection_sample
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=3, max_tokens=40, ignore_eos=True)]
    prompts = REPETITIVE_PROMPTS[:2]
    expected = LLM(DEMO_MODEL, device="cpu").generate(prompts, params, use_tqdm=False)
    monkeypatch.setattr(model_runner, "build_proposer", build)
    monkeypatch.setattr(spec_decode, "rejection_sample", recording)
    runs = []
    for _ in range(2):
        llm = spec_llm(DEMO_MODEL)
        runs.append(llm.generate(prompts, params, use_tqdm=False))
        assert made[-1].calls > 0 and llm.engine.spec_totals.num_accepted_tokens > 0
    assert runs[0][0]["token_ids"] == expected[0]["token_ids"]
    assert [o["token_ids"] for o in runs[0]] == [o["token_ids"] for o in runs[1]]
    verified = [(ids, probs) for nd, ids, probs in seen if sum(nd)]
    assert verified and all(probs is not None and probs.shape == (len(ids), 4032) for ids, probs in verified)
    for ids, probs in verified:  # each draft's row: half the mass on the draft itself
        assert torch.allclose(probs[torch.arange(len(ids)), ids], torch.full((len(ids),), 0.5 + 0.5 / 4032))


def test_above_disable_by_batch_size_async_scheduling_runs_ahead():
    """With asynchronous scheduling, a batch above ``disable_by_batch_size`` is scheduled one step ahead (its
    rows read the step in flight's tokens on the device); once it shrinks, speculation resumes from the history,
    which the steps sampled without it were added to. Outputs equal no speculation."""
    params = [SamplingParams(temperature=0, max_tokens=12 + 10 * i, ignore_eos=True) for i in range(6)]
    params[4] = SamplingParams(temperature=0.9, seed=4, max_tokens=40, ignore_eos=True, repetition_penalty=1.1)
    prompts = REPETITIVE_PROMPTS[:6]
    expected = LLM(DEMO_MODEL, device="cpu", async_scheduling=True).generate(prompts, params, use_tqdm=False)
    llm = spec_llm(DEMO_MODEL, {**NGRAM, "disable_by_batch_size": 3}, async_scheduling=True)
    runner = llm.engine.executor.runner
    ahead = []
    execute = runner.execute

    def counting(inp, gather=True):
        ahead.append(inp.prev_token_index is not None)
        return execute(inp, gather)

    runner.execute = counting
    step, sample, checked = runner.spec_step, runner.spec_step.sample, []

    def checking(run, fwd, inp, grammar=None):
        out = sample(run, fwd, inp, grammar)
        for r, row in enumerate(fwd.out.sampled):  # the history: every token, the pending ones' values too
            seq = llm.engine.scheduler.seqs.get(row.seq_id)
            if seq is not None:
                slot, new = step.batch.slots[row.seq_id], out.tokens_of(r)
                history = step.batch.token_ids[slot, :step.batch.num_tokens[slot]].tolist()
                known = seq.token_ids[:seq.num_known_tokens]
                assert history[:len(known)] == known and history[len(history) - len(new):] == new
                assert len(history) == seq.num_tokens - 1 + len(new)  # its newest placeholder: this step's
                checked.append(seq.num_pending_tokens)
        return out

    step.sample = checking
    got = llm.generate(prompts, params, use_tqdm=False)
    assert 2 in checked  # a verifying step right after one scheduled ahead: its history came from the handle
    greedy = [i for i, p in enumerate(params) if p.temperature == 0]
    assert [got[i]["token_ids"] for i in greedy] == [expected[i]["token_ids"] for i in greedy]
    assert len(got[4]["token_ids"]) == 40
    assert any(ahead) and llm.engine.spec_totals.num_accepted_tokens > 0
    assert not runner.spec_step.deferred or all(h.resolved for _, h in runner.spec_step.deferred)
    llm.engine.scheduler.check_integrity()


def test_a_proposer_that_needs_every_step_sees_the_large_batches(monkeypatch):
    """A model-based proposer keeps a KV cache of its own: above disable_by_batch_size it is still called each
    step, asked for no drafts; an n-gram proposer is not called there."""
    from minivllm.spec_decode.ngram_drafter import NgramDrafter
    from minivllm.worker import model_runner

    calls = []

    class Recording(NgramDrafter):
        needs_every_step = True

        def propose(self, inputs):
            calls.append((inputs.num_rows, int(inputs.max_drafts.max())))
            return super().propose(inputs)

    monkeypatch.setattr(model_runner, "build_proposer", lambda spec, *a: Recording(4, 2, 4))
    params = [SamplingParams(temperature=0, max_tokens=8 + 8 * i, ignore_eos=True) for i in range(4)]
    expected = LLM(DEMO_MODEL, device="cpu").generate(REPETITIVE_PROMPTS[:4], params, use_tqdm=False)
    llm = spec_llm(DEMO_MODEL, {**NGRAM, "disable_by_batch_size": 2}, async_scheduling=True)
    got = llm.generate(REPETITIVE_PROMPTS[:4], params, use_tqdm=False)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
    assert {m for n, m in calls if n > 2} == {0} and {m for n, m in calls if n <= 2} == {4}
