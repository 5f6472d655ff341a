"""Which LoRA adapter sits in which device slot: the scheduler's bookkeeping (vLLM's active adapters). Pure Python.

The runner holds ``max_loras`` slots of adapter weights on the device. An adapter takes a slot when the first
of its sequences is admitted and keeps it while any of its sequences runs, so a running sequence's slot never
changes; once none runs, the slot stays loaded (a later request of that adapter reuses it) until another
adapter needs it, the least recently used idle slot going first. The scheduler admits a sequence of an adapter
without a slot only while some slot is idle: at most ``max_loras`` distinct adapters run at once.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

from minivllm.lora.request import LoRARequest


class LoRASlots:
    """The ``max_loras`` device slots: ``slot_of`` (adapter -> slot), the adapters in use (``users``: running
    sequences per adapter) and the slots in least-recently-used order.

    An adapter is its whole ``LoRARequest``: after ``remove_lora``, the same id may come back with another folder
    while sequences of the old one still run, and the two then take two slots."""

    def __init__(self, max_loras: int):
        if max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {max_loras}")
        self.max_loras = max_loras
        self.slot_of: dict[LoRARequest, int] = {}
        self.adapters: list[LoRARequest | None] = [None] * max_loras  # slot -> the adapter loaded in it
        self.users: dict[LoRARequest, int] = {}  # adapter -> running sequences of it (> 0)
        self._lru: OrderedDict[int, None] = OrderedDict.fromkeys(range(max_loras))  # slots, least recent first

    @property
    def num_active(self) -> int:
        """Adapters with a running sequence (each holds its slot)."""
        return len(self.users)

    def can_admit(self, lora: LoRARequest) -> bool:
        """Whether a sequence of this adapter can run now: it holds a slot already, or some slot is idle."""
        return lora in self.users or len(self.users) < self.max_loras

    def acquire(self, lora: LoRARequest) -> tuple[int, bool]:
        """Count one more running sequence of ``lora``; returns its slot and whether the runner must load the
        adapter into it first (it was not in a slot). RuntimeError when no slot is idle (``can_admit`` is False)."""
        slot = self.slot_of.get(lora)
        load = slot is None
        if load:
            slot = next((s for s in self._lru if self._idle(s)), None)
            if slot is None:
                raise RuntimeError(f"no idle LoRA slot for adapter {lora.lora_name!r}: {self.max_loras} adapters run")
            old = self.adapters[slot]
            if old is not None:
                del self.slot_of[old]
            self.adapters[slot], self.slot_of[lora] = lora, slot
        self.users[lora] = self.users.get(lora, 0) + 1
        self._lru.move_to_end(slot)
        return slot, load

    def release(self, lora: LoRARequest) -> None:
        """One running sequence of the adapter stopped running (finished or preempted); its slot stays loaded."""
        n = self.users.get(lora, 0)
        if n < 1:
            raise RuntimeError(f"LoRA adapter {lora.lora_name!r} released more often than acquired")
        if n == 1:
            del self.users[lora]
        else:
            self.users[lora] = n - 1

    def forget(self, lora_int_id: int) -> None:
        """Empty the slots of the adapters of this id that no sequence runs (``remove_lora``); one that runs keeps
        its slot until its sequences end."""
        for lora in [a for a in self.slot_of if a.lora_int_id == lora_int_id and a not in self.users]:
            slot = self.slot_of.pop(lora)
            self.adapters[slot] = None
            self._lru.move_to_end(slot, last=False)

    def _idle(self, slot: int) -> bool:
        adapter = self.adapters[slot]
        return adapter is None or adapter not in self.users

    def check_integrity(self, running: list[LoRARequest] | None = None) -> None:
        """Assert the invariants; ``running`` (the adapter of each running sequence that has one), when given,
        must count as ``users`` does."""
        assert len(self.users) <= self.max_loras, f"{len(self.users)} adapters run on {self.max_loras} slots"
        assert sorted(self._lru) == list(range(self.max_loras)), "a slot is lost from the LRU order"
        for lora, slot in self.slot_of.items():
            assert self.adapters[slot] == lora, f"slot {slot} holds another adapter"
        assert sum(a is not None for a in self.adapters) == len(self.slot_of), "a slot's adapter is unmapped"
        assert self.users.keys() <= self.slot_of.keys(), "a running adapter has no slot"
        assert all(n > 0 for n in self.users.values())
        if running is not None:
            running = dict(Counter(running))
            assert running == self.users, f"running sequences per adapter {running}, counted {self.users}"
