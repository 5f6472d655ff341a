"""Asynchronous scheduling in the pure-Python layer: the same tokens as synchronous scheduling.

A fake device samples each row's token from the sequence's *device-side* token list (the
known tokens, with placeholders replaced by the values sampled for them), as the GPU does;
the host only learns the values one step later (``resolve``). Random workloads with EOS
stops, chunked prefill, prefix caching and preemption must end with exactly the tokens and
finish reasons of the synchronous loop, with the invariants intact after every step.
"""

from hypothesis import HealthCheck, given, settings
from test_scheduler_property import workloads

from minivllm.engine.block_manager import BlockManager
from minivllm.engine.scheduler import Scheduler
from minivllm.engine.sequence import PLACEHOLDER, Sequence
from minivllm.sampling_params import SamplingParams

EOS = 0


def fake_token(tokens: list[int], index: int) -> int:
    """A deterministic 'model': the next token depends only on the request and its tokens so far."""
    if (len(tokens) + 3 * index) % 11 == 0:
        return EOS
    return 4 + (sum(tokens[-3:]) * 7 + len(tokens) + index) % 50


class FakeDevice:
    """Holds the sampled values of placeholders, keyed by (seq_id, position)."""

    def __init__(self, index_of: dict[int, int]):
        self.values: dict[tuple[int, int], int] = {}
        self.index_of = index_of

    def sample(self, scheduler_output) -> list[int]:
        tokens = []
        for seq, n in scheduler_output.scheduled:
            if seq.num_computed_tokens + n != seq.num_tokens:
                continue
            truth = [self.values[(seq.seq_id, pos)] if t == PLACEHOLDER else t for pos, t in enumerate(seq.token_ids)]
            tokens.append(fake_token(truth, self.index_of[seq.seq_id]))
        return tokens

    def record(self, seqs: list[Sequence], tokens: list[int]) -> None:
        for seq, t in zip(seqs, tokens, strict=True):
            self.values[(seq.seq_id, seq.num_tokens - 1)] = t


def run(workload, async_scheduling: bool):
    block_size, num_blocks, max_model_len, reqs, cfg = workload
    cfg = dict(cfg)
    bm = BlockManager(num_blocks, block_size, cfg.pop("enable_prefix_caching"))
    sched = Scheduler(bm, max_model_len=max_model_len, eos_token_ids=[EOS], **cfg)
    pending = sorted(enumerate(reqs), key=lambda x: x[1][0])
    seqs: dict[int, Sequence] = {}
    device = FakeDevice({})
    inflight = None
    wasted = 0
    step = 0
    while pending or not sched.is_finished() or inflight is not None:
        while pending and pending[0][1][0] <= step:
            i, (_, prompt, max_tokens) = pending.pop(0)
            seqs[i] = Sequence(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=i % 3 == 0))
            device.index_of[seqs[i].seq_id] = i
            sched.add(seqs[i])
        out = sched.schedule()
        assert out.num_batched_tokens <= cfg["max_num_batched_tokens"]
        launched = None
        if not out.is_empty:
            tokens = device.sample(out)
            sampled = sched.advance(out)
            device.record(sampled, tokens)
            launched = (sampled, tokens)
        elif not sched.is_finished():
            assert inflight is not None, "a step with unfinished work and nothing in flight computed nothing"
        if async_scheduling:
            previous, inflight = inflight, launched
        else:
            previous, inflight = launched, None
        if previous is not None:
            rows = sched.resolve(*previous)
            wasted += len(previous[0]) - len(rows)
        counts = sched.check_integrity()
        assert counts["used"] + counts["cached"] + counts["free"] == num_blocks
        step += 1
        assert step < 100_000
    assert bm.check_integrity([])["used"] == 0
    return {i: (s.token_ids, s.finish_reason, s.num_pending_tokens) for i, s in seqs.items()}, wasted


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_async_scheduling_gives_the_synchronous_tokens(workload):
    sync, sync_wasted = run(workload, async_scheduling=False)
    asyn, _ = run(workload, async_scheduling=True)
    assert sync_wasted == 0
    assert asyn == sync
    assert all(pending == 0 for _, _, pending in asyn.values())


def test_a_stop_found_late_costs_one_row_and_leaves_no_placeholder():
    bm = BlockManager(8, 16)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, eos_token_ids=[EOS])
    seq = Sequence([5, 6, 7], SamplingParams(max_tokens=10))
    sched.add(seq)
    out1 = sched.schedule()  # prefill
    rows1 = sched.advance(out1)
    assert seq.token_ids == [5, 6, 7, PLACEHOLDER] and seq.pending_row == 0
    out2 = sched.schedule()  # decodes the placeholder before its value is known
    assert out2.scheduled == [(seq, 1)]
    rows2 = sched.advance(out2)
    assert seq.token_ids == [5, 6, 7, PLACEHOLDER, PLACEHOLDER] and seq.num_pending_tokens == 2
    assert sched.resolve(rows1, [EOS]) == [(0, seq)]
    assert seq.is_finished and seq.finish_reason == "stop" and seq.token_ids == [5, 6, 7, EOS]
    assert bm.num_used_blocks == 0
    assert sched.resolve(rows2, [9]) == []  # the wasted row is dropped
    assert seq.token_ids == [5, 6, 7, EOS]
    sched.check_integrity()


def test_a_block_completed_by_a_placeholder_is_cached_once_known():
    bm = BlockManager(8, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, eos_token_ids=[EOS])
    seq = Sequence([5, 6, 7], SamplingParams(max_tokens=10, ignore_eos=True))
    sched.add(seq)
    rows = sched.advance(sched.schedule())  # token 4 of block 0 is a placeholder
    out = sched.schedule()
    assert bm.hash_to_block_id == {}  # block 0 is full of slots but its last value is unknown
    prev = rows
    rows = sched.advance(out)
    sched.resolve(prev, [8])
    sched.advance(sched.schedule())  # the next allocation registers block 0
    assert bm.blocks[seq.block_table[0]].token_ids == [5, 6, 7, 8]
    assert seq.num_registered_blocks == 1
    sched.check_integrity()
