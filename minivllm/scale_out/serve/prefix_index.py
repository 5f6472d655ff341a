"""Which replica has which prompt prefix cached, as the router saw it: pure Python, no Ray.

Each replica keeps the KV blocks of the prompts it ran in its prefix cache, keyed by a chain hash of full blocks
(``kvcache_block_size`` tokens). The router cannot ask the replicas what they hold, so it remembers the chain hashes
of the prompts it sent to each one, least recently used first out once a replica's entry count passes its
capacity. A request then prefers the replica that holds the longest run of its leading blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The chain hash of each full block of ``token_ids``: block i's hash covers tokens ``[0, (i+1)*block_size)``."""
    out, h = [], 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        h = hash((h, tuple(token_ids[start:start + block_size])))
        out.append(h)
    return out


class PrefixIndex:
    """Per replica, the block chain hashes of the prompts routed to it (an LRU of ``capacity`` hashes each)."""

    def __init__(self, block_size: int, capacity: int = 100_000):
        if block_size < 1 or capacity < 1:
            raise ValueError(f"block_size and capacity must be >= 1, got {block_size} and {capacity}")
        self.block_size, self.capacity = block_size, capacity
        self._blocks: dict[Hashable, OrderedDict[int, None]] = {}

    def insert(self, replica: Hashable, hashes: Iterable[int]) -> None:
        """Remember that ``replica`` now caches these blocks (the most recently used ones)."""
        lru = self._blocks.setdefault(replica, OrderedDict())
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def matched_blocks(self, replica: Hashable, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt (its ``hashes``) ``replica`` holds."""
        lru = self._blocks.get(replica)
        if not lru:
            return 0
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def best(self, replicas: Iterable[Hashable], hashes: Sequence[int]) -> tuple[Hashable | None, int]:
        """``(replica, blocks)``: the replica holding the longest prefix of ``hashes`` (the first one on a tie),
        ``(None, 0)`` when none holds even the first block."""
        best, most = None, 0
        for r in replicas:
            n = self.matched_blocks(r, hashes)
            if n > most:
                best, most = r, n
        return best, most

    def remove(self, replica: Hashable) -> None:
        """Forget a replica (it died: its successor starts with an empty cache)."""
        self._blocks.pop(replica, None)

    def retain(self, replicas: set) -> None:
        """Forget every replica not in ``replicas``."""
        for r in [r for r in self._blocks if r not in replicas]:
            del self._blocks[r]

    def check_integrity(self) -> None:
        """Raise AssertionError if a replica holds more than ``capacity`` hashes."""
        for replica, lru in self._blocks.items():
            assert len(lru) <= self.capacity, f"replica {replica!r} holds {len(lru)} > {self.capacity} hashes"
