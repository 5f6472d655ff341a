"""The KV cache groups' block managers behind one interface (vLLM's ``KVCacheCoordinator``). Pure Python.

A model whose attention layers are all of one type has one group, and this is a thin wrapper of its
``BlockManager``. A hybrid model (Gemma 3: full and sliding-window layers) has one ``BlockManager`` per group:
a sequence is admitted or grows only when every group can hold it, and a prefix-cache hit is the longest one
every group has (``get_computed_blocks``).
"""

from __future__ import annotations

from minivllm.core.block_manager import BlockManager
from minivllm.core.kv_cache_spec import blocks_per_seq
from minivllm.core.sequence import Sequence


class KVCacheManager:
    """Hands out the blocks of every KV cache group (``managers``, group 0 first) to sequences.

    ``block_table(seq_id)`` is group 0's table (all a one-group model has); ``group_tables(seq_id)`` all of them.
    Counts (``num_blocks``, ``num_used_blocks``, ...) are summed over the groups.
    """

    def __init__(self, managers: list[BlockManager]):
        if not managers:
            raise ValueError("a KV cache needs at least one group")
        if len({m.block_size for m in managers}) != 1:
            raise ValueError("every KV cache group must have the same block size")
        self.managers = managers
        self.num_groups = len(managers)
        self.block_size = managers[0].block_size
        self._single = managers[0] if len(managers) == 1 else None

    # ----------------------------------------------------------------- queries
    @property
    def num_blocks(self) -> int:
        """Blocks of every group's pool."""
        return sum(m.num_blocks for m in self.managers)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take now, in every group."""
        return sum(m.num_free_blocks for m in self.managers)

    @property
    def num_used_blocks(self) -> int:
        """Blocks some sequence holds, in every group."""
        return sum(m.num_used_blocks for m in self.managers)

    @property
    def num_cached_blocks(self) -> int:
        """Evictable blocks holding reusable prefix content, in every group."""
        return sum(m.num_cached_blocks for m in self.managers)

    @property
    def seq_ids(self) -> set[int]:
        """The sequences that hold blocks (the same in every group)."""
        return self.managers[0].seq_ids

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """Group 0's block table of a sequence."""
        return self.managers[0].block_table(seq_id)

    def group_tables(self, seq_id: int) -> tuple[tuple[int, ...], ...]:
        """Every group's block table of a sequence, in group order."""
        return tuple(m.block_table(seq_id) for m in self.managers)

    def check_fits(self, num_tokens: int, chunk: int) -> None:
        """Raise ValueError unless every group can hold one sequence of ``num_tokens`` tokens computing ``chunk``
        tokens a step (else it could never finish)."""
        for g, m in enumerate(self.managers):
            need = blocks_per_seq(m.sliding_window, num_tokens, m.block_size, chunk)
            if m.num_blocks < need:
                group = "" if self._single is not None else f" group {g} (window {m.sliding_window})"
                raise ValueError(
                    f"the KV cache{group} holds {m.num_blocks} blocks x {m.block_size} tokens = "
                    f"{m.num_blocks * m.block_size} tokens, fewer than max_model_len ({num_tokens}) needs there "
                    f"({need} blocks): one sequence could never finish; raise num_kvcache_blocks or lower "
                    f"max_model_len")

    def get_computed_blocks(self, seq: Sequence) -> list[list[int]]:
        """Each group's head of the block table of the longest prefix-cache hit all groups have (one length)."""
        if self._single is not None:
            return [self._single.get_computed_blocks(seq)]
        hits = [m.get_computed_blocks(seq) for m in self.managers]
        n = min(len(h) for h in hits)
        while any(len(h) != n for h in hits):  # a shorter hit: a sliding window's may end earlier still
            hits = [h[:n] if m.sliding_window is None else m.get_computed_blocks(seq, n)
                    for m, h in zip(self.managers, hits)]
            n = min(len(h) for h in hits)
        return hits

    # ---------------------------------------------------------------- updates
    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       computed_blocks: list[list[int]] | None = None, num_lookahead_tokens: int = 0) -> bool:
        """Every group's ``allocate_slots``; False (no group's table grown) unless all of them can."""
        if self._single is not None:
            return self._single.allocate_slots(seq, num_new_tokens, computed_blocks[0] if computed_blocks else None,
                                               num_lookahead_tokens)
        if not all(m.can_allocate(seq, num_new_tokens, computed_blocks[g] if computed_blocks else None,
                                  num_lookahead_tokens)
                   for g, m in enumerate(self.managers)):
            return False
        for g, m in enumerate(self.managers):
            ok = m.allocate_slots(seq, num_new_tokens, computed_blocks[g] if computed_blocks else None,
                                  num_lookahead_tokens)
            if not ok:
                raise RuntimeError(f"KV cache group {g} refused an allocation it said it could make: {seq}")
        return True

    def free(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks in every group."""
        for m in self.managers:
            m.free(seq)

    def reset_prefix_cache(self) -> None:
        """Forget every group's cached block contents."""
        for m in self.managers:
            m.reset_prefix_cache()

    # -------------------------------------------------------------- integrity
    def check_integrity(self) -> dict[str, int]:
        """Every group's invariants, the same sequences in each, tables of one length; the summed counts."""
        counts = {"used": 0, "cached": 0, "free": 0}
        for m in self.managers:
            assert m.seq_ids == self.managers[0].seq_ids, "the KV cache groups hold different sequences"
            for k, v in m.check_integrity().items():
                counts[k] += v
        for seq_id in self.seq_ids:
            assert len({len(t) for t in self.group_tables(seq_id)}) == 1, f"sequence {seq_id}: tables differ"
        return counts

    def check_window(self, seq: Sequence) -> None:
        """Every sliding group still holds the blocks ``seq``'s next query reaches."""
        for m in self.managers:
            m.check_window(seq)
