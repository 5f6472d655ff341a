"""Asynchronous scheduling in the pure-Python layer: the same tokens as synchronous scheduling.

A fake device keeps a paged cache of token values, written and read only through the frozen scheduler
outputs (the rows' new tokens, block tables rebuilt from the outputs' deltas as the runner's persistent batch
does, a placeholder's value read from the previous step's sampled row), and samples each row's token from the context it reads back, as the GPU does; the host only learns the values one step later
(``update_from_output``). Random workloads with EOS
stops, chunked prefill, prefix caching and preemption must end with exactly the tokens and
finish reasons of the synchronous loop, with the invariants intact after every step.
"""

from hypothesis import HealthCheck, given, settings

from minivllm.core.block_manager import BlockManager
from minivllm.core.scheduler import Scheduler
from minivllm.core.sequence import PLACEHOLDER, Sequence
from minivllm.sampling_params import SamplingParams
from tests.helpers.scheduler_utils import new_seq
from tests.test_scheduler_property import workloads

EOS = 0


def fake_token(tokens: list[int], index: int) -> int:
    """A deterministic 'model': the next token depends only on the request and its tokens so far."""
    if (len(tokens) + 3 * index) % 11 == 0:
        return EOS
    return 4 + (sum(tokens[-3:]) * 7 + len(tokens) + index) % 50


class FakeDevice:
    """The device side of a step: a paged KV cache holding token values, filled and read through block tables
    kept from the outputs' deltas only (prefix-cache hits read blocks another sequence wrote)."""

    def __init__(self, index_of: dict[int, int], block_size: int):
        self.kv: dict[int, int] = {}  # slot -> the token whose K/V it holds
        self.index_of, self.block_size = index_of, block_size
        self.tables: dict[int, list[int]] = {}  # seq id -> its block table, as the runner's batch holds it
        self.last: list[int] = []  # the previous launched step's sampled tokens, by row

    def _slot(self, row, pos: int) -> int:
        return self.tables[row.seq_id][pos // self.block_size] * self.block_size + pos % self.block_size

    def sample(self, scheduler_output) -> list[int]:
        for seq_id in scheduler_output.finished_seq_ids:
            del self.tables[seq_id]
        for req in scheduler_output.new_requests:
            assert req.seq_id not in self.tables
            self.tables[req.seq_id] = list(req.block_ids)
        sampled = []
        for row in scheduler_output.rows:
            self.tables[row.seq_id] += row.new_block_ids
            new = [self.last[row.prev_sampled_row]] if row.prev_sampled_row >= 0 else list(row.token_ids)
            assert PLACEHOLDER not in new
            for i, t in enumerate(new):
                self.kv[self._slot(row, row.num_computed_tokens + i)] = t
            if row.sampled:
                context = [self.kv[self._slot(row, p)] for p in range(row.num_computed_tokens + len(new))]
                sampled.append(fake_token(context, self.index_of[row.seq_id]))
        self.last = sampled
        return sampled


def run(workload, async_scheduling: bool):
    block_size, num_blocks, max_model_len, reqs, cfg = workload
    cfg = dict(cfg)
    bm = BlockManager(num_blocks, block_size, cfg.pop("enable_prefix_caching"))
    sched = Scheduler(bm, max_model_len=max_model_len, eos_token_ids=[EOS], **cfg)
    pending = sorted(enumerate(reqs), key=lambda x: x[1][0])
    seqs: dict[int, Sequence] = {}
    device = FakeDevice({}, block_size)
    inflight = None
    wasted = 0
    step = 0
    while pending or not sched.is_finished() or inflight is not None:
        while pending and pending[0][1][0] <= step:
            i, (_, prompt, max_tokens) = pending.pop(0)
            seqs[i] = new_seq(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=i % 3 == 0))
            device.index_of[seqs[i].seq_id] = i
            sched.add(seqs[i])
        out = sched.schedule()
        assert out.num_batched_tokens <= cfg["max_num_batched_tokens"]
        launched = None
        if not out.is_empty:
            launched = (out, device.sample(out))
        elif not sched.is_finished():
            assert inflight is not None, "a step with unfinished work and nothing in flight computed nothing"
        if async_scheduling:
            previous, inflight = inflight, launched
        else:
            previous, inflight = launched, None
        if previous is not None:
            rows = sched.update_from_output(*previous)
            wasted += len(previous[0].sampled) - len(rows)
        counts = sched.check_integrity()
        assert counts["used"] + counts["cached"] + counts["free"] == num_blocks
        step += 1
        assert step < 100_000
    assert bm.check_integrity()["used"] == 0
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
    seq = new_seq([5, 6, 7], SamplingParams(max_tokens=10))
    sched.add(seq)
    out1 = sched.schedule()  # prefill
    assert seq.token_ids == [5, 6, 7, PLACEHOLDER] and seq.pending_row == 0
    out2 = sched.schedule()  # decodes the placeholder before its value is known
    assert [(r.seq_id, r.num_computed_tokens, r.prev_sampled_row) for r in out2.rows] == [(seq.seq_id, 3, 0)]
    assert seq.token_ids == [5, 6, 7, PLACEHOLDER, PLACEHOLDER] and seq.num_pending_tokens == 2
    assert sched.update_from_output(out1, [EOS]) == [(0, seq)]
    assert seq.is_finished and seq.finish_reason == "stop" and seq.token_ids == [5, 6, 7, EOS]
    assert bm.num_used_blocks == 0
    assert sched.update_from_output(out2, [9]) == []  # the wasted row is dropped
    assert seq.token_ids == [5, 6, 7, EOS]
    sched.check_integrity()


def test_a_block_completed_by_a_placeholder_is_cached_once_known():
    bm = BlockManager(8, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, eos_token_ids=[EOS])
    seq = new_seq([5, 6, 7], SamplingParams(max_tokens=10, ignore_eos=True))
    sched.add(seq)
    first = sched.schedule()  # token 4 of block 0 is a placeholder
    sched.schedule()
    assert bm.hash_to_block_id == {}  # block 0 is full of slots but its last value is unknown
    sched.update_from_output(first, [8])
    sched.schedule()  # the next allocation registers block 0
    assert bm.blocks[bm.block_table(seq.seq_id)[0]].token_ids == [5, 6, 7, 8]
    assert bm._registered[seq.seq_id] == 1
    sched.check_integrity()
