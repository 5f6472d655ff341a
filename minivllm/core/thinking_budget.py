"""A request's ``thinking_token_budget`` (vLLM's): at most that many tokens between the reasoning's start
marker and its end marker (``--reasoning-config``, as token ids); once they are spent, the end marker is forced,
one token per step, and the model answers after it.

The state is read off the sequence's tokens (prompt and output) at each step, so it survives preemption and
recomputation: the reasoning is open when the last start marker has no end marker after it (a template that
ends the prompt with ``<think>`` opens it, an earlier turn's closed block does not); its tokens are those after
the start marker, less a partial end marker the output already ends with (the forcing under way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def _last_index(haystack: Sequence[int], needle: Sequence[int], stop: int = 0) -> int:
    """The start of the last occurrence of ``needle`` in ``haystack`` at or after ``stop`` (-1: none)."""
    n = len(needle)
    first = needle[0]
    for i in range(len(haystack) - n, stop - 1, -1):
        if haystack[i] == first and tuple(haystack[i:i + n]) == tuple(needle):
            return i
    return -1


@dataclass(frozen=True)
class ThinkingBudget:
    """``budget`` tokens of reasoning between ``start_ids`` and ``end_ids`` (both non-empty)."""

    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    budget: int

    def forced_token(self, token_ids: Sequence[int]) -> int | None:
        """The token the next step must sample (the next one of the end marker), or None: free."""
        start = _last_index(token_ids, self.start_ids)
        if start < 0:
            return None
        after = start + len(self.start_ids)
        if _last_index(token_ids, self.end_ids, after) >= 0:
            return None  # the reasoning ended
        # the longest proper prefix of the end marker that the tokens end with: the forcing so far
        done = next((k for k in range(len(self.end_ids) - 1, 0, -1)
                     if len(token_ids) - after >= k and tuple(token_ids[len(token_ids) - k:]) == self.end_ids[:k]),
                    0)
        if len(token_ids) - after - done < self.budget:
            return None
        return self.end_ids[done]


class ThinkingTracker:
    """``ThinkingBudget.forced_token`` for one sequence, step by step: each call reads only the tokens appended
    since the one before (a sequence's tokens only grow, preemption keeps them), so a step costs the new tokens
    and a marker's length, not the whole sequence."""

    def __init__(self, budget: ThinkingBudget):
        self.budget = budget
        self.scanned = 0  # tokens searched for a start marker
        self.start = -1  # index of the last start marker found (-1: none)
        self.end_scanned = 0  # tokens searched for an end marker after ``start``
        self.ended = False  # an end marker follows ``start``

    def forced_token(self, token_ids: Sequence[int]) -> int | None:
        """The token the next step must sample, or None: free (``ThinkingBudget.forced_token``'s answer)."""
        b, n = self.budget, len(token_ids)
        ls, le = len(b.start_ids), len(b.end_ids)
        found = _last_index(token_ids, b.start_ids, max(0, self.scanned - ls + 1))
        self.scanned = n
        if found >= 0:  # a newer start marker: the reasoning it opens is what counts
            self.start, self.end_scanned, self.ended = found, found + ls, False
        if self.start < 0:
            return None
        after = self.start + ls
        if not self.ended:
            self.ended = _last_index(token_ids, b.end_ids, max(after, self.end_scanned - le + 1)) >= 0
            self.end_scanned = n
        if self.ended:
            return None
        done = next((k for k in range(le - 1, 0, -1)
                     if n - after >= k and tuple(token_ids[n - k:]) == b.end_ids[:k]), 0)
        if n - after - done < b.budget:
            return None
        return b.end_ids[done]
