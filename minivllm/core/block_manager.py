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

#: the id in a sliding window's block table of a block released because it left the window (no block of the
#: pool): positions stay aligned, and the runner maps it to a real block that the kernels never read unmasked
NULL_BLOCK = -1


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

    ``sliding_window`` (tokens; None: full attention): the pool of a KV cache group of sliding-window layers
    (vLLM's ``SlidingWindowManager``). Before each allocation, the leading blocks whose every token is older than
    the window of the sequence's oldest query still to run are released and replaced by ``NULL_BLOCK`` in its
    table; a prefix-cache hit needs only the blocks of the window before the hit's end.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 sliding_window: int | None = None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks}x{block_size}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block_id: dict[int, int] = {}
        # seq_id -> block ids in token order; NOTE: a tuple, replaced (never changed) when blocks are added, so a
        # scheduler output can hold a table without copying it
        self._tables: dict[int, tuple[int, ...]] = {}
        self._registered: dict[int, int] = {}  # seq_id -> leading blocks already offered to the prefix cache
        self._skipped: dict[int, int] = {}  # seq_id -> leading table entries released (NULL_BLOCK); sliding only

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

    def num_skipped_blocks(self, num_computed_tokens: int) -> int:
        """Leading blocks a sliding window no longer reaches once ``num_computed_tokens`` are computed: every
        token of them is older than the oldest key, ``num_computed_tokens - W + 1``, of the next query (0 for
        full attention)."""
        if self.sliding_window is None:
            return 0
        return max(0, (num_computed_tokens - self.sliding_window + 1) // self.block_size)

    def _cached_block(self, seq: Sequence, i: int, h: int) -> int | None:
        """The id of the cached block holding ``seq``'s block ``i`` (chained hash ``h``), verified by its tokens."""
        block_id = self.hash_to_block_id.get(h)
        if block_id is None:
            return None
        block, bs = self.blocks[block_id], self.block_size
        if block.hash != h or block.token_ids != seq.token_ids[i * bs:(i + 1) * bs]:
            return None
        return block_id

    def get_computed_blocks(self, seq: Sequence, max_blocks: int | None = None) -> list[int]:
        """Block table head of the longest cached prefix of ``seq``'s tokens (full blocks only, at most
        ``max_blocks``).

        At most ``num_tokens - 1`` tokens can hit, so that at least one token is computed
        and the row yields logits. A hit is verified against the block's token ids. A sliding window's hit of
        ``n`` blocks needs only the blocks its window reaches from position ``n * block_size`` on; the ones
        before are ``NULL_BLOCK``.
        """
        if not self.enable_prefix_caching or seq.prompt_logprobs is not None:
            return []  # a request for prompt logprobs computes its whole prompt (as vLLM does)
        bs = self.block_size
        limit = (seq.num_tokens - 1) // bs
        limit = limit if max_blocks is None else min(limit, max_blocks)
        hashes = self.block_hashes(seq, limit)
        if self.sliding_window is None:
            hits: list[int] = []
            for i in range(limit):
                block_id = self._cached_block(seq, i, hashes[i])
                if block_id is None:
                    break
                hits.append(block_id)
            return hits
        # the longest n whose window's blocks [skipped(n), n) all hit
        ids = [self._cached_block(seq, i, hashes[i]) for i in range(limit)]
        runs, run = [], 0  # runs[i]: consecutive hits ending at block i
        for block_id in ids:
            run = run + 1 if block_id is not None else 0
            runs.append(run)
        for n in range(limit, 0, -1):
            first = self.num_skipped_blocks(n * bs)
            if runs[n - 1] >= n - first:
                return [NULL_BLOCK] * first + ids[first:n]
        return []

    # ---------------------------------------------------------------- updates
    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None,
                       num_lookahead_tokens: int = 0) -> bool:
        """Make ``seq``'s block table cover ``num_new_tokens`` more tokens; False (and no change) if it can't.

        ``num_lookahead_tokens``: slots for that many tokens past the sequence's end (speculative drafts, computed
        this step but not yet its tokens): covered by the table, never offered to the prefix cache.

        ``computed_blocks`` (from ``get_computed_blocks``) are taken on admission: they become
        the head of the block table and ``seq.num_computed_tokens`` jumps past them. Full blocks
        whose tokens are all known after this step are registered in the prefix cache. A sliding window first
        releases the blocks it no longer reaches (also when the allocation then fails: they are never read again).
        """
        bs = self.block_size
        table = self._tables.get(seq.seq_id)
        if table is not None and not computed_blocks and num_new_tokens == 1 and not num_lookahead_tokens:
            # decode fast path: nothing to release, allocate or cache
            end = seq.num_computed_tokens + 1
            if end <= len(table) * bs and (
                    not self.enable_prefix_caching
                    or min(end, seq.num_known_tokens) // bs <= self._registered[seq.seq_id]) and (
                    self.sliding_window is None
                    or self.num_skipped_blocks(end - 1) <= self._skipped[seq.seq_id]):
                return True
        if table and self.sliding_window is not None:
            table = self._release_skipped(seq.seq_id, table, self.num_skipped_blocks(seq.num_computed_tokens))
        computed_blocks = computed_blocks or []
        if computed_blocks and table:
            raise RuntimeError(f"prefix hits given for a sequence that already holds blocks: {seq}")
        num_computed, end, num_new_blocks, num_revived = self._needs(seq, table or _EMPTY, num_new_tokens,
                                                                     computed_blocks, num_lookahead_tokens)
        if num_new_blocks + num_revived > len(self.free_queue):
            return False
        if table is None:
            table = ()
            self._registered[seq.seq_id] = 0
            self._skipped[seq.seq_id] = 0
        added: list[int] = []
        for block_id in computed_blocks:
            if block_id == NULL_BLOCK:
                added.append(block_id)
                self._skipped[seq.seq_id] += 1
                continue
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

    def _needs(self, seq: Sequence, table: tuple[int, ...], num_new_tokens: int,
               computed_blocks: list[int], num_lookahead_tokens: int = 0) -> tuple[int, int, int, int]:
        """``(num_computed, end, new blocks, cached blocks revived)`` of an allocation of ``num_new_tokens`` (and
        ``num_lookahead_tokens`` past the end); ``end`` leaves the lookahead out."""
        bs = self.block_size
        num_computed = len(computed_blocks) * bs if computed_blocks else seq.num_computed_tokens
        end = num_computed + num_new_tokens
        if end > seq.num_tokens:
            raise RuntimeError(f"scheduling {num_new_tokens} tokens past the end of {seq}")
        num_held = len(computed_blocks) if computed_blocks else len(table)
        num_new_blocks = max(0, (end + num_lookahead_tokens + bs - 1) // bs - num_held)
        num_revived = sum(1 for b in computed_blocks if b != NULL_BLOCK and self.blocks[b].ref_count == 0)
        return num_computed, end, num_new_blocks, num_revived

    def can_allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None,
                     num_lookahead_tokens: int = 0) -> bool:
        """Whether ``allocate_slots`` with these arguments would succeed (counting the blocks a sliding window
        releases first). Changes nothing."""
        table = self._tables.get(seq.seq_id, _EMPTY)
        computed_blocks = computed_blocks or []
        _, _, num_new_blocks, num_revived = self._needs(seq, table, num_new_tokens, computed_blocks,
                                                        num_lookahead_tokens)
        num_released = 0
        if table and self.sliding_window is not None:
            done, stop = self._skipped[seq.seq_id], self.num_skipped_blocks(seq.num_computed_tokens)
            num_released = sum(1 for b in table[done:stop] if self.blocks[b].ref_count == 1)
        return num_new_blocks + num_revived <= len(self.free_queue) + num_released

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
            if table[i] == NULL_BLOCK:
                continue  # released by a sliding window before its last token was known
            block = self.blocks[table[i]]
            if block.hash != -1 or hashes[i] in self.hash_to_block_id:
                continue  # already cached (a hit), or the same content lives in another block
            block.hash = hashes[i]
            block.token_ids = seq.token_ids[i * bs:(i + 1) * bs]
            self.hash_to_block_id[block.hash] = block.block_id

    def _release_skipped(self, seq_id: int, table: tuple[int, ...], num_skipped: int) -> tuple[int, ...]:
        """Release the leading blocks of a sliding window's table up to ``num_skipped`` (NULL_BLOCK in their
        place); returns the new table."""
        done = self._skipped[seq_id]
        if num_skipped <= done:
            return table
        num_skipped = min(num_skipped, len(table))
        self._drop(reversed(table[done:num_skipped]), seq_id)
        self._skipped[seq_id] = num_skipped
        table = self._tables[seq_id] = (NULL_BLOCK,) * num_skipped + table[num_skipped:]
        return table

    def _drop(self, block_ids, owner) -> None:
        """Drop one reference to each of ``block_ids`` (in the order given); a block left unreferenced joins the
        free queue: at its back if cached, else at its front."""
        for block_id in block_ids:
            if block_id == NULL_BLOCK:
                continue
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count < 0:
                raise RuntimeError(f"double free of block {block_id} by {owner}")
            if block.ref_count == 0:
                self.free_queue[block_id] = None
                if block.hash == -1:
                    self.free_queue.move_to_end(block_id, last=False)

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references (tail first) and its block table; its computed tokens are forgotten."""
        self._registered.pop(seq.seq_id, None)
        self._skipped.pop(seq.seq_id, None)
        self._drop(reversed(self._tables.pop(seq.seq_id, _EMPTY)), seq)
        seq.num_computed_tokens = 0

    def num_live_blocks(self, seq_id: int) -> int:
        """Blocks ``seq_id``'s table holds (its ``NULL_BLOCK`` entries not counted)."""
        table = self._tables.get(seq_id, _EMPTY)
        return len(table) - self._skipped.get(seq_id, 0)

    def check_window(self, seq: Sequence) -> None:
        """Assert that a running sequence's table still holds every block its next query's window reaches."""
        skipped = self._skipped.get(seq.seq_id, 0)
        assert skipped <= self.num_skipped_blocks(seq.num_computed_tokens), (
            f"{seq}: {skipped} blocks released, but its window reaches back to block "
            f"{self.num_skipped_blocks(seq.num_computed_tokens)}")

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
        assert self._tables.keys() == self._registered.keys() == self._skipped.keys()
        for seq_id, table in self._tables.items():
            skipped = self._skipped[seq_id]
            assert self.sliding_window is not None or not skipped, "a full-attention table released blocks"
            assert all(b == NULL_BLOCK for b in table[:skipped]), f"sequence {seq_id}: a released block kept"
            live = table[skipped:]
            assert NULL_BLOCK not in live, f"sequence {seq_id}: a released block after a live one"
            assert len(set(live)) == len(live), f"block listed twice in sequence {seq_id}'s table"
            assert self._registered[seq_id] <= len(table), f"sequence {seq_id} registered past its table"
            for b in live:
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
