"""The LoRA bookkeeping without a model: device slots (``LoRASlots``), the scheduler's adapter limit and the
loads it sends, prefix-cache hashes keyed on the adapter, and the runner's per-token slot mapping."""

from __future__ import annotations

import random
from itertools import count

import numpy as np
import pytest

from minivllm.core.block_manager import BlockManager, hash_block
from minivllm.core.lora_slots import LoRASlots
from minivllm.core.sequence import Sequence
from minivllm.lora.request import LoRARequest
from minivllm.sampling_params import SamplingParams
from minivllm.worker.input_batch import InputBatch
from tests.helpers.scheduler_utils import fake_tokens, make_scheduler

_ids = count(10_000)


def lora(i: int) -> LoRARequest:
    return LoRARequest(f"adapter-{i}", i, f"/adapters/{i}")


def lora_seq(prompt_len: int, adapter: int, max_tokens: int = 3, start: int = 10) -> Sequence:
    """A sequence of adapter ``adapter`` (0: the base model)."""
    return Sequence(next(_ids), [start + i for i in range(prompt_len)],
                    SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0),
                    lora_request=lora(adapter) if adapter else None)


def test_lora_request_checks_its_fields():
    req = LoRARequest("a", 1, "/x")
    assert (req.adapter_id, req.name, req.path) == (1, "a", "/x")
    for args, name in ((("", 1, "/x"), "lora_name"), (("a", 0, "/x"), "lora_int_id"),
                       (("a", True, "/x"), "lora_int_id"), (("a", 1, ""), "lora_path")):
        with pytest.raises(ValueError, match=name):
            LoRARequest(*args)


def test_slots_keep_running_adapters_and_evict_the_least_recent_idle_one():
    slots = LoRASlots(2)
    assert slots.acquire(lora(1)) == (0, True)
    assert slots.acquire(lora(1)) == (0, False)  # a second sequence of it shares the slot
    assert slots.acquire(lora(2)) == (1, True)
    assert not slots.can_admit(lora(3)) and slots.can_admit(lora(1))
    with pytest.raises(RuntimeError, match="no idle LoRA slot"):
        slots.acquire(lora(3))
    slots.check_integrity([lora(1), lora(1), lora(2)])
    slots.release(lora(2))  # adapter 2 idle, still loaded
    assert slots.can_admit(lora(3))
    assert slots.acquire(lora(2)) == (1, False)  # reused without a load
    slots.release(lora(2))
    slots.release(lora(1))
    slots.release(lora(1))  # both idle; adapter 1's slot was used longest ago
    assert slots.acquire(lora(3)) == (0, True)
    assert slots.slot_of == {lora(3): 0, lora(2): 1}
    slots.check_integrity([lora(3)])
    with pytest.raises(RuntimeError, match="released more often"):
        slots.release(lora(2))
    slots.forget(3)  # in use: kept
    assert lora(3) in slots.slot_of
    slots.release(lora(3))
    slots.forget(3)
    assert lora(3) not in slots.slot_of
    assert slots.acquire(lora(4)) == (0, True)  # the emptied slot goes first
    slots.check_integrity([lora(4)])


def test_an_id_reused_for_another_folder_is_another_adapter():
    """After remove_lora, id 1 may name another folder while the old one's sequences still run: two slots, and
    prefix hashes that differ."""
    old, new = lora(1), LoRARequest("adapter-1", 1, "/adapters/elsewhere")
    slots = LoRASlots(2)
    assert slots.acquire(old) == (0, True)
    assert slots.acquire(new) == (1, True)
    slots.check_integrity([old, new])
    assert lora_seq(1, 1).lora_key != Sequence(0, [1], lora_request=new).lora_key


def test_scheduler_admits_no_more_adapters_than_slots_and_sends_each_load_once():
    sched = make_scheduler(budget=256, max_loras=2)
    seqs = [lora_seq(20, a) for a in (1, 2, 3, 0, 1, 3)]
    for s in seqs:
        sched.add(s)
    out = sched.schedule()
    # adapter 3 has no slot: its sequences wait, the base model's and adapter 1's second one pass them
    assert [r.seq_id for r in out.rows] == [seqs[i].seq_id for i in (0, 1, 3, 4)]
    assert out.lora_loads == ((0, lora(1)), (1, lora(2)))
    slots = {n.seq_id: n.lora_slot for n in out.new_requests}
    assert [slots[seqs[i].seq_id] for i in (0, 1, 3, 4)] == [0, 1, -1, 0]
    assert [s.seq_id for s in sched.waiting] == [seqs[2].seq_id, seqs[5].seq_id]  # their order kept
    sched.check_integrity()
    loads = list(out.lora_loads)
    sched.update_from_output(out, fake_tokens(out))
    while not sched.is_finished():
        out = sched.schedule()
        loads += out.lora_loads
        assert len({s.lora_int_id for s in sched.running if s.lora_int_id}) <= 2
        sched.update_from_output(out, fake_tokens(out))
        sched.check_integrity()
    # adapter 3 took the slot of adapter 2 (idle first); adapter 1 never left its slot
    assert loads == [(0, lora(1)), (1, lora(2)), (1, lora(3))]
    assert all(s.completion_token_ids and s.is_finished for s in seqs)


def test_scheduler_without_slots_refuses_an_adapter():
    with pytest.raises(ValueError, match="lora_request"):
        make_scheduler().add(lora_seq(4, 1))


@pytest.mark.parametrize("seed", range(4))
def test_random_lora_traffic_keeps_every_invariant(seed):
    """Random arrivals of four adapters and the base model on two slots, a tight KV cache (preemptions) and
    aborts: every step within the slots, the runner's view (loads and per-sequence slots) always consistent."""
    rng = random.Random(seed)
    sched = make_scheduler(num_blocks=8, budget=48, max_num_seqs=6, max_model_len=96, max_loras=2)
    runner_slots: dict[int, LoRARequest] = {}  # slot -> adapter, as the runner would hold them
    seq_slot: dict[int, int] = {}
    live: list[Sequence] = []
    for _ in range(300):
        if rng.random() < 0.4:
            s = lora_seq(rng.randrange(2, 40), rng.randrange(5), max_tokens=rng.randrange(1, 30),
                         start=rng.randrange(3))
            sched.add(s)
            live.append(s)
        if live and rng.random() < 0.05:
            victim = live.pop(rng.randrange(len(live)))
            if not victim.is_finished:
                sched.finish(victim, "abort")
        out = sched.schedule()
        for slot, adapter in out.lora_loads:
            runner_slots[slot] = adapter
        for seq_id in out.finished_seq_ids:
            seq_slot.pop(seq_id, None)
        for new in out.new_requests:
            seq_slot[new.seq_id] = new.lora_slot
        adapters = set()
        for row in out.rows:
            seq = sched.seqs.get(row.seq_id)
            slot = seq_slot[row.seq_id]
            if seq.lora_request is not None:
                assert runner_slots[slot] == seq.lora_request, "a row reads another adapter's slot"
                adapters.add(seq.lora_request)
            else:
                assert slot == -1
        assert len(adapters) <= 2
        sched.update_from_output(out, fake_tokens(out))
        sched.check_integrity()
    assert sched.num_preemptions > 0


def test_prefix_hashes_are_keyed_on_the_adapter():
    tokens = list(range(16))
    assert hash_block(-1, tokens) != hash_block(-1, tokens, b"1") != hash_block(-1, tokens, b"2")
    h = hash_block(-1, tokens, b"1")
    assert hash_block(h, tokens, b"1") == hash_block(h, tokens, b"2")  # later blocks chain on the first's hash
    bm = BlockManager(16, 16)
    prompt = list(range(40))
    first = lora_seq(1, 1)
    first.token_ids = list(prompt)
    assert bm.allocate_slots(first, 40)
    for adapter, hits in ((2, 0), (0, 0), (1, 2)):
        s = lora_seq(1, adapter)
        s.token_ids = list(prompt)
        assert len(bm.get_computed_blocks(s)) == hits, f"adapter {adapter}"
    bm.check_integrity()


def test_input_batch_maps_each_token_to_its_adapter_slot():
    sched = make_scheduler(budget=64, max_loras=2)
    batch = InputBatch(8, 256, 16)
    seqs = [lora_seq(5, 0), lora_seq(3, 2), lora_seq(4, 1)]
    for s in seqs:
        sched.add(s)
    out = sched.schedule()
    batch.update(out)
    inp = batch.prepare_inputs(out)
    assert inp.lora_slots.tolist() == [-1] * 5 + [0] * 3 + [1] * 4
    sched.update_from_output(out, fake_tokens(out))
    out = sched.schedule()  # decode: one token a row
    batch.update(out)
    assert batch.prepare_inputs(out).lora_slots.tolist() == [-1, 0, 1]
    sched.finish(seqs[1], "abort")
    sched.finish(seqs[2], "abort")
    sched.update_from_output(out, fake_tokens(out))
    out = sched.schedule()
    batch.update(out)
    assert batch.prepare_inputs(out).lora_slots is None  # no adapter left: no mapping
    assert batch.num_lora_seqs == 0 and (batch.lora_slot == -1).all()
    batch.check_integrity()
    assert np.array_equal(batch.lora_slot, np.full(8, -1))
