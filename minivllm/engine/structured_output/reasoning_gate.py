"""ReasoningGate: holds a sequence's grammar back while a thinking model reasons (vLLM's ``should_advance`` /
``should_fill_bitmask`` with a reasoning parser): until the output ends with the reasoning's end marker, the
grammar's mask is not applied and its matcher is not advanced; from the next token on, the grammar applies.

A gate may also be undecided (``opened_by``: a prompt that neither opened nor closed the reasoning): the first
output token then decides. If it is the reasoning's start token (and not one the grammar takes), the gate
closes until the end marker; otherwise there is no reasoning and the grammar applies from that very token.
"""

from __future__ import annotations


class ReasoningGate:
    """Follows one sequence's output tokens until they end with ``end_ids`` (the end marker's token ids);
    ``opened_by``: the start token that closes an undecided gate (None: closed from the start)."""

    __slots__ = ("end_ids", "opened_by", "tail")

    def __init__(self, end_ids: tuple[int, ...], opened_by: int | None = None):
        self.end_ids, self.opened_by = end_ids, opened_by
        self.tail: tuple[int, ...] = ()  # the newest output tokens, at most len(end_ids)

    @property
    def undecided(self) -> bool:
        """The first output token has yet to say whether the model reasons."""
        return self.opened_by is not None

    def push(self, token_id: int) -> bool:
        """Take the next output token of a closed gate; True once the output ends with the end marker (the gate
        opens)."""
        self.tail = (self.tail + (token_id,))[-len(self.end_ids):]
        return self.tail == self.end_ids
