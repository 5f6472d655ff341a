"""The scheduler with speculative drafts, step by step (pure Python): the token budget counts drafts, their KV
slots are reserved as lookahead, the computed count is rolled back for rejected drafts, and ``check_integrity``
covers the drafts in flight. A random workload against a fake deterministic model must give the tokens it gives
without speculation."""

import random

import pytest

from minivllm.core.sequence import SequenceStatus
from minivllm.sampling_params import SamplingParams
from minivllm.structured_outputs_params import StructuredOutputsParams
from tests.helpers.scheduler_utils import EOS, make_scheduler, make_seq, new_seq


def decoding(sched, seq, first=50):
    """Admit ``seq`` and prefill it: it then decodes (its token ``first`` is sampled)."""
    sched.add(seq)
    out = sched.schedule()
    sched.update_from_output(out, [[first]], [[]])
    sched.check_integrity()
    return out


def test_drafts_count_in_the_budget_and_reserve_slots():
    s = make_scheduler(budget=64, block_size=16, num_speculative_tokens=4)
    seq = make_seq(15, max_tokens=20)
    decoding(s, seq)
    assert seq.num_tokens == 16 and seq.num_computed_tokens == 15
    assert s.block_manager.block_table(seq.seq_id) == (0,)
    seq.spec_token_ids = [60, 61, 62]
    out = s.schedule()
    (row,) = out.rows
    assert row.token_ids == (50, 60, 61, 62) and row.num_draft_tokens == 3 and row.num_computed_tokens == 15
    assert (out.num_decode_tokens, out.num_draft_tokens, out.num_prefill_tokens) == (4, 3, 0)
    # the drafts' slots (positions 16..18) are allocated: a second block
    assert len(s.block_manager.block_table(seq.seq_id)) == 2
    assert seq.num_computed_tokens == 19 and seq.num_tokens == 17 and not seq.spec_token_ids
    s.check_integrity()  # mid-flight: computed runs ahead of the tokens by the drafts
    # the first two drafts are accepted, the third rejected: the target's token 70 follows them
    s.update_from_output(out, [[60, 61, 70]], [[80, 81]])
    assert seq.token_ids[-4:] == [50, 60, 61, 70] and seq.num_new_tokens == 3
    assert seq.num_computed_tokens == 18 and seq.num_tokens == 19  # rolled back: one token uncomputed
    assert seq.spec_token_ids == [80, 81]
    s.check_integrity()


def test_drafts_are_cut_to_the_budget_max_tokens_and_max_model_len():
    s = make_scheduler(budget=3, num_speculative_tokens=4)
    a = make_seq(3, max_tokens=50)
    decoding(s, a)
    a.spec_token_ids = [1, 2, 3, 4]
    out = s.schedule()
    assert out.rows[0].num_draft_tokens == 2 and out.num_batched_tokens == 3  # 1 + 2 drafts = the budget
    s.update_from_output(out, [[9]], [[]])  # every draft rejected
    assert a.num_computed_tokens == a.num_tokens - 1

    s = make_scheduler(budget=64, num_speculative_tokens=4)
    b = make_seq(4, max_tokens=3)
    decoding(s, b)  # 1 of 3 tokens generated: at most 2 more, so 1 draft
    b.spec_token_ids = [1, 2, 3, 4]
    assert s.schedule().rows[0].num_draft_tokens == 1

    s = make_scheduler(budget=64, max_model_len=8, num_speculative_tokens=4)
    c = make_seq(5, max_tokens=50)
    decoding(s, c)  # 6 tokens of 8: at most 2 more, so 1 draft
    c.spec_token_ids = [1, 2, 3, 4]
    assert s.schedule().rows[0].num_draft_tokens == 1


def test_an_accepted_stop_token_ends_the_sequence_and_drops_what_follows():
    s = make_scheduler(budget=64, num_speculative_tokens=4)
    seq = make_seq(6, max_tokens=20, ignore_eos=False)
    decoding(s, seq)
    seq.spec_token_ids = [7, EOS, 9]
    out = s.schedule()
    blocks_used = s.block_manager.num_used_blocks
    s.update_from_output(out, [[7, EOS, 9, 11]], [[1, 2]])
    assert seq.is_finished and seq.finish_reason == "stop" and seq.stop_reason == EOS
    assert seq.completion_token_ids == [50, 7, EOS] and seq.num_new_tokens == 2
    assert s.block_manager.num_used_blocks < blocks_used and not s.running
    s.check_integrity()


def test_max_tokens_reached_inside_the_accepted_tokens():
    s = make_scheduler(budget=64, num_speculative_tokens=4)
    seq = make_seq(6, max_tokens=4)
    decoding(s, seq)
    seq.spec_token_ids = [7, 8, 9]
    out = s.schedule()
    assert out.rows[0].num_draft_tokens == 2  # 1 generated, 3 to go: the row yields at most 3 tokens
    s.update_from_output(out, [[7, 8, 10]], [[]])
    assert seq.is_finished and seq.finish_reason == "length" and seq.completion_token_ids == [50, 7, 8, 10]


def test_no_drafts_when_blocks_run_short_rather_than_preempting():
    # 2 blocks of 16: a sequence at 31 tokens can take its next token in its own blocks, not 4 drafts
    s = make_scheduler(num_blocks=2, block_size=16, budget=64, max_model_len=32, num_speculative_tokens=4)
    seq = make_seq(30, max_tokens=2)
    decoding(s, seq)
    seq.spec_token_ids = [1, 2, 3, 4]
    out = s.schedule()
    assert out.rows[0].num_draft_tokens == 0 and not out.preempted_seq_ids
    s.check_integrity()


def test_preemption_forgets_drafts():
    s = make_scheduler(num_blocks=4, block_size=16, budget=64, max_model_len=64, num_speculative_tokens=2)
    a, b = make_seq(16, max_tokens=40), make_seq(16, max_tokens=40, start=300)
    s.add(a), s.add(b)
    out = s.schedule()
    s.update_from_output(out, [[5], [5]], [[], []])
    b.spec_token_ids = [1, 2]
    a.spec_token_ids = [3, 4]
    # both need a second block for their drafts; the pool has two free: a's and b's. Grow them until one goes
    for _ in range(40):
        out = s.schedule()
        s.check_integrity()
        if out.preempted_seq_ids:
            break
        s.update_from_output(out, [[5] for _ in out.sampled], [[6, 6] for _ in out.sampled])
    else:
        pytest.fail("no preemption")
    victim = a if a.status == SequenceStatus.WAITING else b
    assert victim.spec_token_ids == [] and victim.seq_id in out.preempted_seq_ids


def test_sequences_that_cannot_speculate_get_no_drafts():
    s = make_scheduler(budget=64, num_speculative_tokens=3)
    params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    reader = new_seq([10, 11, 12], params, bad_words_token_ids=((40, 41),))  # reads its newest token on the host
    gated_so = StructuredOutputsParams(regex="[ab]+")
    object.__setattr__(gated_so, "starts_after", (7,))  # the server's: after a reasoning's end marker
    gated = new_seq([13, 14], SamplingParams(temperature=0, max_tokens=9, structured_outputs=gated_so))
    grammar = new_seq([15, 16], SamplingParams(temperature=0, max_tokens=9,
                                               structured_outputs=StructuredOutputsParams(regex="[ab]+")))
    for seq in (reader, gated, grammar):
        s.add(seq)
    out = s.schedule()
    s.update_from_output(out, [[5]] * 3, [[6, 7]] * 3)
    assert (reader.spec_token_ids, gated.spec_token_ids, grammar.spec_token_ids) == ([], [], [6, 7])
    out = s.schedule()
    assert [r.num_draft_tokens for r in out.rows] == [0, 0, 2]


def test_disable_by_batch_size():
    s = make_scheduler(budget=64, num_speculative_tokens=2, disable_by_batch_size=1)
    a, b = make_seq(4, max_tokens=30), make_seq(4, max_tokens=30, start=200)
    s.add(a), s.add(b)
    out = s.schedule()
    s.update_from_output(out, [[5], [5]], [[6, 7], [6, 7]])
    out = s.schedule()  # two running: more than 1
    assert out.num_draft_tokens == 0
    s.update_from_output(out, [[6], [6]], [[6, 7], [6, 7]])
    s.finish(b, "abort")
    out = s.schedule()
    assert out.num_draft_tokens == 2


def test_integrity_catches_computed_past_the_drafts():
    s = make_scheduler(budget=64, num_speculative_tokens=2)
    seq = make_seq(4, max_tokens=30)
    decoding(s, seq)
    seq.spec_token_ids = [1, 2]
    s.schedule()
    seq.num_computed_tokens += 1
    with pytest.raises(AssertionError, match="drafts in flight"):
        s.check_integrity()


def _target(context_last: int, seq_id: int) -> int:
    """The fake model: the next token is a function of the previous token (and the sequence)."""
    return 3 + (context_last * 7 + seq_id) % 29


def _run(spec: bool, seed: int, **kw):
    """Drive a random workload to the end; the fake runner verifies drafts (right ones with probability 1/2)."""
    rng = random.Random(seed)
    s = make_scheduler(num_speculative_tokens=3 if spec else 0, **kw)
    seqs = []
    for i in range(10):
        seq = make_seq(rng.randrange(1, 40), max_tokens=rng.randrange(1, 30), start=rng.randrange(3, 30),
                       ignore_eos=bool(i % 3))
        seqs.append(seq)
        s.add(seq)
    accepted, first = 0, seqs[0].seq_id
    while not s.is_finished():
        out = s.schedule()
        s.check_integrity()
        new_ids, drafts = [], []
        for row in out.sampled:
            d = row.num_draft_tokens
            last = row.token_ids[len(row.token_ids) - 1 - d]
            tokens = []
            for j in range(d + 1):  # the target's token at each position, drafts kept while equal
                t = _target(last, row.seq_id - first)
                tokens.append(t)
                if j == d or row.token_ids[len(row.token_ids) - d + j] != t:
                    break
                last = t
            accepted += len(tokens) - 1
            new_ids.append(tokens)
            nxt, guess = [], tokens[-1]
            for _ in range(rng.randrange(0, 4)):
                guess = _target(guess, row.seq_id - first) if rng.random() < 0.5 else rng.randrange(3, 40)
                nxt.append(guess)
            drafts.append(nxt)
        s.update_from_output(out, new_ids, drafts if spec else None)
        s.check_integrity()
    return [seq.completion_token_ids for seq in seqs], [seq.finish_reason for seq in seqs], accepted


@pytest.mark.parametrize("kw", [dict(), dict(num_blocks=12, budget=24, max_model_len=64),
                                dict(num_blocks=9, budget=7, max_model_len=64, enable_prefix_caching=False)])
@pytest.mark.parametrize("seed", range(4))
def test_random_workloads_give_the_tokens_of_no_speculation(kw, seed):
    plain_tokens, plain_reasons, _ = _run(False, seed, **kw)
    tokens, reasons, accepted = _run(True, seed, **kw)
    assert tokens == plain_tokens and reasons == plain_reasons
    assert accepted > 0
