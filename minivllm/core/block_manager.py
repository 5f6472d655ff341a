"""Paged KV cache bookkeeping: block ids, ref counts, LRU free queue, prefix cache. Pure Python."""

from __future__ import annotations

from array import array
from collections import OrderedDict

import xxhash

from minivllm.core.sequence import PLACEHOLDER, Sequence


def hash_block(prev_hash: int, token_ids: list[int]) -> int:
    """Chained xxh64 of a full block: the hash names the whole token prefix up to this block."""
    h = xxhash.xxh64()
    if prev_hash != -1:
        h.update(prev_hash.to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    return h.intdigest()


_EMPTY: tuple[int, ...] = ()


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1  # -1: not (yet) a full, content-addressable block
        self.token_ids: list[int] = []

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_count}, hash={self.hash != -1})"


class BlockManager:
    """Hands out KV cache blocks to sequences, owns their block tables, and shares full blocks by content.

    A block is in one of three states: *used* (ref_count > 0), *cached* (ref_count == 0 but
    still holding a full block registered in the prefix cache: reusable until evicted), or
    *free* (ref_count == 0, no content). Cached and free blocks both sit in ``free_queue``, an
    LRU order: allocation takes the front, so the least recently freed cached block is evicted
    first. Content-less blocks go to the front when freed, cached ones to the back, and a
    sequence's blocks are freed tail first so that shared prefixes outlive their suffixes.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks}x{block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block_id: dict[int, int] = {}
        # seq_id -> block ids in token order; NOTE: a tuple, replaced (never changed) when blocks are added, so a
        # scheduler output can hold a table without copying it
        self._tables: dict[int, tuple[int, ...]] = {}
        self._registered: dict[int, int] = {}  # seq_id -> leading blocks already offered to the prefix cache

    # ----------------------------------------------------------------- queries
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take now (free plus evictable cached ones)."""
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        """Evictable blocks that still hold reusable prefix content."""
        return sum(1 for b in self.free_queue if self.blocks[b].hash != -1)

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """The block ids of a sequence, in token order (empty if it holds none)."""
        return self._tables.get(seq_id, _EMPTY)

    @property
    def seq_ids(self) -> set[int]:
        """The sequences that hold blocks."""
        return set(self._tables)

    def block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        """Chained hashes of the first ``num_full_blocks`` full blocks of ``seq`` (memoised on seq)."""
        hashes = seq.block_hashes
        bs = self.block_size
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            hashes.append(hash_block(hashes[-1] if hashes else -1, seq.token_ids[i * bs:(i + 1) * bs]))
        return hashes

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix of ``seq``'s tokens (full blocks only).

        At most ``num_tokens - 1`` tokens can hit, so that at least one token is computed
        and the row yields logits. A hit is verified against the block's token ids.
        """
        if not self.enable_prefix_caching or seq.prompt_logprobs is not None:
            return []  # a request for prompt logprobs computes its whole prompt (as vLLM does)
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        hits: list[int] = []
        for i, h in enumerate(self.block_hashes(seq, max_blocks)):
            block_id = self.hash_to_block_id.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.hash != h or block.token_ids != seq.token_ids[i * bs:(i + 1) * bs]:
                break
            hits.append(block_id)
        return hits

    # ---------------------------------------------------------------- updates
    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None) -> bool:
        """Make ``seq``'s block table cover ``num_new_tokens`` more tokens; False (and no change) if it can't.

        ``computed_blocks`` (from ``get_computed_blocks``) are taken on admission: they become
        the head of the block table and ``seq.num_computed_tokens`` jumps past them. Full blocks
        whose tokens are all known after this step are registered in the prefix cache.
        """
        bs = self.block_size
        table = self._tables.get(seq.seq_id)
        if table is not None and not computed_blocks and num_new_tokens == 1:
            # decode fast path: nothing to allocate or cache
            end = seq.num_computed_tokens + 1
            if end <= len(table) * bs and (
                    not self.enable_prefix_caching
                    or min(end, seq.num_known_tokens) // bs <= self._registered[seq.seq_id]):
                return True
        computed_blocks = computed_blocks or []
        if computed_blocks and table:
            raise RuntimeError(f"prefix hits given for a sequence that already holds blocks: {seq}")
        num_computed = len(computed_blocks) * bs if computed_blocks else seq.num_computed_tokens
        end = num_computed + num_new_tokens
        if end > seq.num_tokens:
            raise RuntimeError(f"scheduling {num_new_tokens} tokens past the end of {seq}")
        num_required = (end + bs - 1) // bs
        num_held = len(computed_blocks) if computed_blocks else len(table or ())
        num_new_blocks = max(0, num_required - num_held)
        num_revived = sum(1 for b in computed_blocks if self.blocks[b].ref_count == 0)
        if num_new_blocks + num_revived > len(self.free_queue):
            return False
        if table is None:
            table = ()
            self._registered[seq.seq_id] = 0
        added: list[int] = []
        for block_id in computed_blocks:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
            added.append(block_id)
        if computed_blocks:
            seq.num_computed_tokens = seq.num_cached_tokens = num_computed
            self._registered[seq.seq_id] = len(computed_blocks)
        for _ in range(num_new_blocks):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            if block.hash != -1:  # evict its cached content
                if self.hash_to_block_id.get(block.hash) == block_id:
                    del self.hash_to_block_id[block.hash]
                block.hash, block.token_ids = -1, []
            block.ref_count = 1
            added.append(block_id)
        if added or seq.seq_id not in self._tables:
            table = self._tables[seq.seq_id] = table + tuple(added)
        if self.enable_prefix_caching:
            self._cache_full_blocks(seq, table, min(end, seq.num_known_tokens) // bs)
        return True

    def _cache_full_blocks(self, seq: Sequence, table: tuple[int, ...], stop: int) -> None:
        """Offer the sequence's blocks from the first not yet offered up to ``stop`` to the prefix cache.

        NOTE: ``stop`` never passes a pending placeholder (asynchronous scheduling): a block
        whose last token is still on the device is registered by a later allocation.
        """
        start = self._registered[seq.seq_id]
        if stop <= start:
            return
        self._registered[seq.seq_id] = stop
        hashes = self.block_hashes(seq, stop)
        bs = self.block_size
        for i in range(start, stop):
            block = self.blocks[table[i]]
            if block.hash != -1 or hashes[i] in self.hash_to_block_id:
                continue  # already cached (a hit), or the same content lives in another block
            block.hash = hashes[i]
            block.token_ids = seq.token_ids[i * bs:(i + 1) * bs]
            self.hash_to_block_id[block.hash] = block.block_id

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references (tail first) and its block table; its computed tokens are forgotten."""
        self._registered.pop(seq.seq_id, None)
        for block_id in reversed(self._tables.pop(seq.seq_id, _EMPTY)):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count < 0:
                raise RuntimeError(f"double free of block {block_id} by {seq}")
            if block.ref_count == 0:
                self.free_queue[block_id] = None
                if block.hash == -1:
                    self.free_queue.move_to_end(block_id, last=False)
        seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached block's content (used blocks keep theirs until freed)."""
        for block_id in self.free_queue:
            block = self.blocks[block_id]
            if block.hash != -1:
                self.hash_to_block_id.pop(block.hash, None)
                block.hash, block.token_ids = -1, []

    # -------------------------------------------------------------- integrity
    def check_integrity(self) -> dict[str, int]:
        """Assert the invariants (ref counts equal block-table references, ...); returns the counts."""
        refs = [0] * len(self.blocks)
        assert self._tables.keys() == self._registered.keys()
        for seq_id, table in self._tables.items():
            assert len(set(table)) == len(table), f"block listed twice in sequence {seq_id}'s table"
            assert self._registered[seq_id] <= len(table), f"sequence {seq_id} registered past its table"
            for b in table:
                refs[b] += 1
        used = cached = free = 0
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], (
                f"{block}: ref_count {block.ref_count} but {refs[block.block_id]} block-table references")
            in_queue = block.block_id in self.free_queue
            assert in_queue == (block.ref_count == 0), f"{block}: in free queue={in_queue}"
            if block.hash != -1:
                assert self.hash_to_block_id.get(block.hash) == block.block_id, f"{block} hash not registered"
                assert len(block.token_ids) == self.block_size
                assert PLACEHOLDER not in block.token_ids, f"{block} cached with a pending token"
            if block.ref_count > 0:
                used += 1
            elif block.hash != -1:
                cached += 1
            else:
                free += 1
        for h, b in self.hash_to_block_id.items():
            assert self.blocks[b].hash == h, f"stale hash entry for block {b}"
        assert used + cached + free == len(self.blocks)
        return {"used": used, "cached": cached, "free": free}
