"""Which LoRA adapter sits in which device slot: the scheduler's bookkeeping (vLLM's active adapters). Pure Python.

The runner holds ``max_loras`` slots of adapter weights on the device. An adapter takes a slot when the first
of its sequences is admitted and keeps it while any of its sequences runs, so a running sequence's slot never
changes; once none runs, the slot stays loaded (a later request of that adapter reuses it) until another
adapter needs it, the least recently used idle slot going first. The scheduler admits a sequence of an adapter
without a slot only while some slot is idle: at most ``max_loras`` distinct adapters run at once.
"""

from __future__ import annotations

from collections import OrderedDict

from minivllm.lora.request import LoRARequest


class LoRASlots:
    """The ``max_loras`` device slots: ``slot_of`` (adapter id -> slot), the adapters in use (``users``: running
    sequences per adapter) and the slots in least-recently-used order."""

    def __init__(self, max_loras: int):
        if max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {max_loras}")
        self.max_loras = max_loras
        self.slot_of: dict[int, int] = {}  # lora_int_id -> slot
        self.adapters: list[LoRARequest | None] = [None] * max_loras  # slot -> the adapter loaded in it
        self.users: dict[int, int] = {}  # lora_int_id -> running sequences of it (> 0)
        self._lru: OrderedDict[int, None] = OrderedDict.fromkeys(range(max_loras))  # slots, least recent first

    @property
    def num_active(self) -> int:
        """Adapters with a running sequence (each holds its slot)."""
        return len(self.users)

    def can_admit(self, lora_int_id: int) -> bool:
        """Whether a sequence of this adapter can run now: it holds a slot already, or some slot is idle."""
        return lora_int_id in self.users or len(self.users) < self.max_loras

    def acquire(self, lora: LoRARequest) -> tuple[int, bool]:
        """Count one more running sequence of ``lora``; returns its slot and whether the runner must load the
        adapter into it first (it was not in a slot). RuntimeError when no slot is idle (``can_admit`` is False)."""
        lora_id = lora.lora_int_id
        slot = self.slot_of.get(lora_id)
        load = slot is None
        if load:
            slot = next((s for s in self._lru if self._idle(s)), None)
            if slot is None:
                raise RuntimeError(f"no idle LoRA slot for adapter {lora_id}: {self.max_loras} adapters run")
            old = self.adapters[slot]
            if old is not None:
                del self.slot_of[old.lora_int_id]
            self.adapters[slot], self.slot_of[lora_id] = lora, slot
        self.users[lora_id] = self.users.get(lora_id, 0) + 1
        self._lru.move_to_end(slot)
        return slot, load

    def release(self, lora_int_id: int) -> None:
        """One running sequence of the adapter stopped running (finished or preempted); its slot stays loaded."""
        n = self.users.get(lora_int_id, 0)
        if n < 1:
            raise RuntimeError(f"LoRA adapter {lora_int_id} released more often than acquired")
        if n == 1:
            del self.users[lora_int_id]
        else:
            self.users[lora_int_id] = n - 1

    def forget(self, lora_int_id: int) -> bool:
        """Empty the adapter's slot unless a sequence of it runs (``remove_lora``); False if one runs."""
        if lora_int_id in self.users:
            return False
        slot = self.slot_of.pop(lora_int_id, None)
        if slot is not None:
            self.adapters[slot] = None
            self._lru.move_to_end(slot, last=False)
        return True

    def _idle(self, slot: int) -> bool:
        adapter = self.adapters[slot]
        return adapter is None or adapter.lora_int_id not in self.users

    def check_integrity(self, running: dict[int, int] | None = None) -> None:
        """Assert the invariants; ``running`` (adapter id -> running sequences of it), when given, must equal
        ``users``."""
        assert len(self.users) <= self.max_loras, f"{len(self.users)} adapters run on {self.max_loras} slots"
        assert sorted(self._lru) == list(range(self.max_loras)), "a slot is lost from the LRU order"
        for lora_id, slot in self.slot_of.items():
            adapter = self.adapters[slot]
            assert adapter is not None and adapter.lora_int_id == lora_id, f"slot {slot} holds another adapter"
        assert sum(a is not None for a in self.adapters) == len(self.slot_of), "a slot's adapter is unmapped"
        assert self.users.keys() <= self.slot_of.keys(), "a running adapter has no slot"
        assert all(n > 0 for n in self.users.values())
        if running is not None:
            assert running == self.users, f"running sequences per adapter {running}, counted {self.users}"
