"""The runner's persistent batch and the penalties' device statistics, checked against plain rebuilds.

``InputBatch`` only ever sees the scheduler's deltas; every step of a random workload (chunked prefill, prefix
hits, preemption, sequences finishing) its inputs must equal inputs built from scratch out of the block manager's
whole tables. ``PenaltyState`` counts each step's sampled tokens on the device; its rows must equal counts of the
token lists.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from minivllm.core.block_manager import BlockManager
from minivllm.core.scheduler import Scheduler
from minivllm.core.sequence import Sequence
from minivllm.sample.metadata import _token_counts
from minivllm.sample.penalties import PenaltyState
from minivllm.sampling_params import SamplingParams
from minivllm.worker.input_batch import InputBatch


def _reference_inputs(out, bm: BlockManager):
    """The step's arrays, from each row's whole block table (what the scheduler output used to carry)."""
    bs = bm.block_size
    ids, pos, slots, ctx, sample, tables = [], [], [], [], [], []
    cu = [0]
    for row in out.rows:
        table = bm.block_table(row.seq_id)
        n = len(row.token_ids)
        ids += list(row.token_ids)
        for p in range(row.num_computed_tokens, row.num_computed_tokens + n):
            pos.append(p)
            slots.append(table[p // bs] * bs + p % bs)
        cu.append(cu[-1] + n)
        ctx.append(row.num_computed_tokens + n)
        if row.sampled:
            sample.append(cu[-1] - 1)
        tables.append(table)
    width = max(map(len, tables))
    padded = [list(t) + [-1] * (width - len(t)) for t in tables]
    return ids, pos, slots, cu, ctx, sample, padded


def test_the_batch_rebuilt_from_deltas_gives_the_inputs_of_whole_tables():
    rng = random.Random(0)
    bs, max_model_len = 4, 96
    bm = BlockManager(26, bs, enable_prefix_caching=True)  # tight: preemption
    sched = Scheduler(bm, max_num_seqs=6, max_num_batched_tokens=40, max_model_len=max_model_len,
                      eos_token_ids=[0])
    batch = InputBatch(6, max_model_len, bs)
    shared = [rng.randrange(1, 50) for _ in range(12)]  # a common prefix: prefix-cache hits
    seq_id, steps, preempted = 0, 0, 0
    while steps < 400:
        if rng.random() < 0.3 and seq_id < 40:
            prompt = (shared if rng.random() < 0.5 else []) + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 30))]
            sched.add(Sequence(seq_id, prompt, SamplingParams(max_tokens=rng.randrange(1, 20), temperature=0)))
            seq_id += 1
        out = sched.schedule()
        if out.is_empty:
            if seq_id >= 40 and sched.is_finished():
                break
            continue
        steps += 1
        preempted += len(out.preempted_seq_ids)
        batch.update(out)
        batch.check_integrity()
        assert set(batch.slots) == {s.seq_id for s in sched.running}  # the runner holds the running set
        inp = batch.prepare_inputs(out)
        ids, pos, slots, cu, ctx, sample, tables = _reference_inputs(out, bm)
        assert inp.input_ids.tolist() == ids and inp.positions.tolist() == pos
        assert inp.slot_mapping.tolist() == slots and inp.cu_seqlens_q.tolist() == cu
        assert inp.context_lens.tolist() == ctx and inp.sample_indices.tolist() == sample
        assert inp.block_tables.tolist() == tables
        assert inp.is_decode == all(len(r.token_ids) == 1 for r in out.rows)
        sched.update_from_output(out, [rng.randrange(1, 50) for _ in out.sampled])
        sched.check_integrity()
    assert steps > 100 and preempted > 0 and seq_id == 40


def test_penalty_rows_count_the_sampled_tokens_on_the_device():
    V = 30
    state = PenaltyState(V, torch.device("cpu"))
    rng = random.Random(1)
    outputs: dict[int, list[int]] = {}
    prompts: dict[int, list[int]] = {}
    for seq in range(12):  # more than the first capacity: the tensors grow
        prompts[seq] = [rng.randrange(V) for _ in range(5)]
        outputs[seq] = [rng.randrange(V) for _ in range(seq % 3)]
        state.add(seq, prompts[seq] if seq % 2 else None, outputs[seq])
    state.remove(4)
    del outputs[4]
    state.add(100, None, [])  # takes row 4's place: it starts from zero
    outputs[100], prompts[100] = [], []
    state.check_integrity()
    for _ in range(5):
        rows = [s for s in outputs if rng.random() < 0.7] + [999]  # 999: a row without penalties
        sampled = torch.tensor([rng.randrange(V) for _ in rows])
        state.record(rows, sampled)
        for s, t in zip(rows, sampled.tolist()):
            if s in outputs:
                outputs[s].append(t)
    order = list(outputs) + [999]
    counts, mask = state.gather(order)
    want = _token_counts([outputs.get(s, []) for s in order], V, torch.device("cpu"))
    assert torch.equal(counts, want)
    want_mask = _token_counts([prompts[s] if s in outputs and s % 2 else [] for s in order], V,
                              torch.device("cpu")) > 0
    assert torch.equal(mask, want_mask)
    assert not counts[-1].any() and not mask[-1].any()  # the zero row
    np.testing.assert_array_equal(sorted(state.rows), sorted(outputs))
