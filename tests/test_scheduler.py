"""Scheduler step by step: exact rows, budgets, queue contents, preemption and chunking."""

from minivllm.core.sequence import SequenceStatus
from tests.helpers.scheduler_utils import EOS, make_scheduler, make_seq, rows, step


def test_prefill_then_decode_in_one_budget():
    s = make_scheduler(budget=64)
    a, b = make_seq(20), make_seq(30, start=1000)
    s.add(a), s.add(b)
    out = step(s)
    assert rows(out) == [(a.seq_id, 20), (b.seq_id, 30)]
    assert (out.num_prefill_tokens, out.num_decode_tokens) == (50, 0)
    assert a.num_completion_tokens == 1 and b.num_completion_tokens == 1
    assert s.block_manager.block_table(a.seq_id) == (0, 1) and s.block_manager.block_table(b.seq_id) == (2, 3)
    out = step(s)
    assert rows(out) == [(a.seq_id, 1), (b.seq_id, 1)] and out.is_decode_only


def test_chunked_prefill_and_mixed_step():
    s = make_scheduler(budget=16, max_model_len=512)
    short = make_seq(4, max_tokens=8)
    s.add(short)
    step(s)  # short: prefilled, one token
    long = make_seq(40, max_tokens=2, start=500)
    s.add(long)
    out = step(s)
    # decode of `short` first, then a 15-token chunk of `long` (budget 16)
    assert rows(out) == [(short.seq_id, 1), (long.seq_id, 15)]
    assert out.num_prefill_tokens == 15 and out.num_decode_tokens == 1
    assert long.status == SequenceStatus.RUNNING and long.num_computed_tokens == 15
    assert long.num_completion_tokens == 0  # a partial prefill is not sampled
    out = step(s)
    assert rows(out) == [(short.seq_id, 1), (long.seq_id, 15)]
    out = step(s)
    assert rows(out) == [(short.seq_id, 1), (long.seq_id, 10)]
    assert long.num_completion_tokens == 1


def test_partial_prefill_limits():
    # threshold 8 caps each chunk, so two prompts could both be partial in one step
    s = make_scheduler(budget=32, max_model_len=512, long_prefill_threshold=8)
    a, b = make_seq(20), make_seq(20, start=300)
    s.add(a), s.add(b)
    assert rows(step(s)) == [(a.seq_id, 8)]  # b would be a second partial prefill
    assert list(s.waiting) == [b]
    s2 = make_scheduler(budget=32, max_model_len=512, long_prefill_threshold=8,
                        max_num_partial_prefills=2, max_long_partial_prefills=1)
    a, b = make_seq(20), make_seq(20, start=300)
    s2.add(a), s2.add(b)
    assert rows(step(s2)) == [(a.seq_id, 8)]  # b is long too: only one long partial prefill
    c = make_seq(6, start=900)
    s3 = make_scheduler(budget=32, max_model_len=512, long_prefill_threshold=8,
                        max_num_partial_prefills=2, max_long_partial_prefills=2)
    a, b = make_seq(20), make_seq(20, start=300)
    s3.add(a), s3.add(b), s3.add(c)
    assert rows(step(s3)) == [(a.seq_id, 8), (b.seq_id, 8), (c.seq_id, 6)]


def test_long_prefill_threshold_caps_chunks():
    s = make_scheduler(budget=64, max_model_len=512, long_prefill_threshold=8)
    a = make_seq(20)
    s.add(a)
    assert rows(step(s)) == [(a.seq_id, 8)]
    assert rows(step(s)) == [(a.seq_id, 8)]
    assert rows(step(s)) == [(a.seq_id, 4)]


def test_preemption_frees_least_progress_and_readmits_at_head():
    # 6 blocks of 16; max_model_len 96 = 6 blocks
    s = make_scheduler(num_blocks=6, budget=256, max_model_len=96)
    a = make_seq(32, max_tokens=40)
    b = make_seq(31, max_tokens=40, start=400)
    c = make_seq(8, max_tokens=2, start=700)
    s.add(a), s.add(b)
    step(s)  # a: 33 tokens (3 blocks), b: 32 tokens (2 blocks); 1 block free
    s.add(c)
    out = step(s)  # decodes; c needs 1 block: admitted
    assert out.rows[-1].seq_id == c.seq_id and s.block_manager.num_free_blocks == 0
    # next decode: b's token 33 needs a new block -> preempt the one with least progress: c
    out = step(s)
    assert out.preempted_seq_ids == (c.seq_id,)
    assert c.status == SequenceStatus.WAITING and list(s.waiting) == [c] and s.block_manager.block_table(c.seq_id) == ()
    assert s.num_preemptions == 1


def test_preempted_sequence_gets_its_prefix_back_from_the_cache():
    s = make_scheduler(num_blocks=4, budget=256, max_model_len=64)
    a = make_seq(40, max_tokens=24)
    s.add(a)
    step(s)
    blocks_before = s.block_manager.block_table(a.seq_id)
    s._preempt(a)
    out = step(s)
    # 41 tokens (40 prompt + 1 generated): two full blocks come back, 9 tokens are recomputed
    assert a.num_cached_tokens == 32 and s.block_manager.block_table(a.seq_id)[:2] == blocks_before[:2]
    assert rows(out) == [(a.seq_id, 9)]
    assert a.num_completion_tokens == 2


def test_max_num_seqs_and_fcfs():
    s = make_scheduler(max_num_seqs=2, budget=256)
    seqs = [make_seq(5, start=100 * i) for i in range(3)]
    for q in seqs:
        s.add(q)
    out = step(s)
    assert [r.seq_id for r in out.rows] == [q.seq_id for q in seqs[:2]]
    assert list(s.waiting) == [seqs[2]]


def test_stops_on_eos_unless_ignored_and_frees_blocks():
    s = make_scheduler()
    a = make_seq(5, max_tokens=10, ignore_eos=False)
    s.add(a)
    out = s.schedule()
    s.update_from_output(out, [EOS])
    assert a.is_finished and a.finish_reason == "stop" and s.block_manager.block_table(a.seq_id) == ()
    assert s.is_finished() and s.block_manager.num_used_blocks == 0


def test_max_tokens_and_max_model_len_give_length():
    s = make_scheduler(max_model_len=8)
    a = make_seq(5, max_tokens=10)
    s.add(a)
    while not s.is_finished():
        step(s)
    assert a.finish_reason == "length" and a.num_tokens == 8


def test_external_finish_of_waiting_and_running():
    s = make_scheduler(max_num_seqs=1)
    a, b = make_seq(5), make_seq(5, start=50)
    s.add(a), s.add(b)
    step(s)
    s.finish(b, "abort")
    s.finish(a, "abort")
    assert s.is_finished() and s.block_manager.num_used_blocks == 0
    s.check_integrity()


def test_the_output_is_a_frozen_snapshot():
    """The runner gets ids, tokens, positions and block ids as they were when the step was scheduled; the
    scheduler has already accounted for the step (computed counts, a placeholder per sampled row)."""
    import pytest

    from minivllm.core.sequence import PLACEHOLDER
    from minivllm.sampling_params import SamplingParams

    s = make_scheduler(budget=64)
    a = make_seq(20)
    b = make_seq(18, start=500)
    b.sampling_params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0, repetition_penalty=1.2)
    s.add(a), s.add(b)
    first = s.schedule()
    assert [(r.seq_id, r.num_computed_tokens, len(r.token_ids), r.new_block_ids, r.prev_sampled_row, r.sampled)
            for r in first.rows] == [(a.seq_id, 0, 20, (), -1, True), (b.seq_id, 0, 18, (), -1, True)]
    assert first.rows[0].token_ids == tuple(range(10, 30))
    assert [(x.seq_id, x.num_output_tokens) for x in first.sampled] == [(a.seq_id, 0), (b.seq_id, 0)]
    # both are new to the runner: each comes whole, once; only a row with penalties carries token values
    assert [(n.seq_id, n.block_ids, n.prompt_token_ids, n.output_token_ids) for n in first.new_requests] == [
        (a.seq_id, (0, 1), None, None), (b.seq_id, (2, 3), tuple(range(500, 518)), ())]
    assert first.new_requests[1].params is b.sampling_params
    assert a.num_computed_tokens == 20 and a.token_ids[-1] == PLACEHOLDER and a.pending_row == 0
    with pytest.raises(AttributeError):
        first.num_decode_tokens = 5
    with pytest.raises(AttributeError):
        first.rows[0].num_computed_tokens = 3
    # asynchronous scheduling: the next step reads a's token from row 0 of the step in flight
    second = s.schedule()
    assert [(r.seq_id, r.num_computed_tokens, r.token_ids, r.prev_sampled_row) for r in second.rows] == [
        (a.seq_id, 20, (0,), 0), (b.seq_id, 18, (0,), 1)]
    assert second.new_requests == () and second.finished_seq_ids == ()
    assert first.rows[0].num_computed_tokens == 0  # the earlier snapshot did not move
    s.update_from_output(first, [7, 8])
    s.update_from_output(second, [9, 10])
    assert a.token_ids[20:] == [7, 9] and b.token_ids[18:] == [8, 10]
    s.check_integrity()


def test_running_rows_carry_only_their_new_blocks_and_the_runner_hears_who_left():
    """A sequence's block table reaches the runner once; later steps name only the blocks added since, and a
    sequence that finished is named once, in the next step that has rows."""
    from minivllm.core.block_manager import BlockManager
    from minivllm.core.scheduler import Scheduler
    from minivllm.core.sequence import Sequence
    from minivllm.sampling_params import SamplingParams

    bm = BlockManager(16, 4)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    a = Sequence(1, list(range(10, 16)), SamplingParams(max_tokens=8, ignore_eos=True, temperature=0))
    b = Sequence(2, list(range(40, 43)), SamplingParams(max_tokens=1, ignore_eos=True, temperature=0))
    s.add(a), s.add(b)
    held: dict[int, list[int]] = {}  # what a runner would hold, rebuilt from the deltas alone
    news = []
    for _ in range(6):
        out = s.schedule()
        for seq_id in out.finished_seq_ids:
            del held[seq_id]
        for req in out.new_requests:
            held[req.seq_id] = list(req.block_ids)
        for row in out.rows:
            held[row.seq_id] += row.new_block_ids
            assert tuple(held[row.seq_id]) == bm.block_table(row.seq_id)
        news.append(([r.seq_id for r in out.new_requests], out.finished_seq_ids,
                     [(r.seq_id, r.new_block_ids) for r in out.rows]))
        s.update_from_output(out, [5] * len(out.sampled))
        s.check_integrity()
    a_blocks = bm.block_table(1)
    assert news[0] == ([1, 2], (), [(1, ()), (2, ())])  # b stops after its one token
    assert news[1] == ([], (2,), [(1, ())])  # a's 7th token still fits its second block
    assert news[2] == ([], (), [(1, ())])
    assert news[3] == ([], (), [(1, (a_blocks[2],))])  # token 9 opens a's third block
    assert held == {1: list(a_blocks)}


def test_a_preempted_sequence_leaves_the_runner_and_comes_back_whole():
    from minivllm.core.block_manager import BlockManager
    from minivllm.core.scheduler import Scheduler
    from minivllm.core.sequence import Sequence
    from minivllm.sampling_params import SamplingParams

    bm = BlockManager(4, 4, enable_prefix_caching=False)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=16)
    params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0, presence_penalty=0.5)
    a = Sequence(1, list(range(10, 17)), params)  # 7 tokens: 2 blocks
    b = Sequence(2, list(range(20, 27)), params)
    s.add(a), s.add(b)
    for tokens in ([3, 4], [5, 6]):
        out = s.schedule()
        assert out.preempted_seq_ids == ()
        s.update_from_output(out, tokens)
    out = s.schedule()  # the 9th token of each needs a third block: the newer sequence is preempted
    assert out.preempted_seq_ids == (2,) and out.finished_seq_ids == (2,)
    s.update_from_output(out, [7])
    while not a.is_finished:
        out = s.schedule()
        s.update_from_output(out, [6] * len(out.sampled))
    out = s.schedule()  # a finished: b comes back whole, its generated token with it (it has a penalty)
    assert out.finished_seq_ids == (1,)
    assert [(n.seq_id, n.block_ids, n.output_token_ids) for n in out.new_requests] == [
        (2, bm.block_table(2), (4, 6))]
    s.check_integrity()


def test_tokens_of_a_finished_sequence_are_dropped():
    s = make_scheduler(budget=64)
    a, b = make_seq(5), make_seq(5, start=70)
    s.add(a), s.add(b)
    out = s.schedule()
    s.finish(a, "abort")
    updated = s.update_from_output(out, [3, 4])
    assert [(row, seq.seq_id) for row, seq in updated] == [(1, b.seq_id)]
    assert a.token_ids == list(range(10, 15)) and b.token_ids[-1] == 4
    s.check_integrity()


def test_prompt_logprob_targets_follow_the_chunks_and_skip_the_prefix_cache():
    """A 40-token prompt in chunks of 16: each chunk's positions score the next prompt tokens, the last chunk
    stops at the prompt's last token; a second sequence asking for prompt logprobs reads no cached block."""
    from minivllm.core.sequence import Sequence

    sched = make_scheduler(budget=16)
    prompt = list(range(10, 50))
    warm = Sequence(900, prompt, make_seq(1).sampling_params)
    sched.add(warm)
    while not warm.is_finished:
        step(sched)
    seq = Sequence(901, prompt, make_seq(1).sampling_params, prompt_logprobs=2)
    sched.add(seq)
    got = []
    while seq.num_computed_tokens < len(prompt):
        out = step(sched)
        (row,) = [r for r in out.rows if r.seq_id == 901]
        got.append(row.prompt_logprobs)
    assert seq.num_cached_tokens == 0
    assert got == [(2, tuple(prompt[1:17])), (2, tuple(prompt[17:33])), (2, tuple(prompt[33:40]))]
