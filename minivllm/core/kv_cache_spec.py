"""KV cache groups (vLLM's hybrid allocator): the attention layers grouped by what they keep of a sequence.

Pure Python. A group is one attention type: full attention (every block of a sequence), or a sliding window of
``W`` tokens (only the blocks the window of the oldest query still to run reaches). Each group has its own block
pool, its own per-sequence block tables and its own cache tensor; the memory budget is split between groups by
the bytes one sequence of ``max_model_len`` tokens needs in each (``split_blocks``).
"""

from __future__ import annotations

from typing import NamedTuple


class KVCacheGroupSpec(NamedTuple):
    """One group: its window in tokens (None: full attention) and its decoder layers' indices, in order."""

    sliding_window: int | None
    layers: tuple[int, ...]


def kv_cache_groups(windows: list[int | None], hybrid: bool = True) -> list[KVCacheGroupSpec]:
    """The groups of layers whose windows are ``windows`` (one per attention layer): full attention first, then
    each window, smallest first. ``hybrid=False``: one full-attention group of every layer (each sliding layer
    still attends over its window, the cache keeps every block)."""
    if not windows:
        raise ValueError("a model needs at least one attention layer")
    if not hybrid:
        return [KVCacheGroupSpec(None, tuple(range(len(windows))))]
    by_window: dict[int | None, list[int]] = {}
    for i, w in enumerate(windows):
        by_window.setdefault(w, []).append(i)
    order = sorted(by_window, key=lambda w: -1 if w is None else w)
    return [KVCacheGroupSpec(w, tuple(by_window[w])) for w in order]


def blocks_per_seq(sliding_window: int | None, num_tokens: int, block_size: int, chunk: int = 1) -> int:
    """The most blocks one sequence of ``num_tokens`` tokens holds at once in a group, computing ``chunk`` new
    tokens a step (a sliding window: the blocks from its oldest query's first key to its newest token)."""
    full = -(-num_tokens // block_size)
    if sliding_window is None:
        return full
    return min(full, -(-(sliding_window - 1 + min(chunk, num_tokens)) // block_size) + 1)


def split_blocks(budget_bytes: int, block_bytes: list[int], per_seq: list[int],
                 min_blocks: list[int] | None = None) -> list[int]:
    """Blocks of each group within ``budget_bytes``: each group first gets ``min_blocks[g]`` (what one sequence
    needs at worst, so that it can always finish), then a share of the rest proportional to the bytes a
    sequence needs there (``per_seq[g]`` blocks of ``block_bytes[g]`` bytes), so that every group holds the same
    number of such sequences. One group takes the whole budget."""
    if len(block_bytes) != len(per_seq) or not block_bytes:
        raise ValueError("need one block size and one per-sequence count for each group")
    if len(block_bytes) == 1:
        return [budget_bytes // block_bytes[0]]
    min_blocks = min_blocks or [0] * len(per_seq)
    rest = budget_bytes - sum(m * b for m, b in zip(min_blocks, block_bytes))
    if rest < 0:  # too small for one sequence: the scheduler refuses it by name
        min_blocks, rest = [0] * len(per_seq), budget_bytes
    per_seq_bytes = sum(n * b for n, b in zip(per_seq, block_bytes))
    return [m + rest * n // per_seq_bytes for m, n in zip(min_blocks, per_seq)]
