"""ReasoningGate: holds a sequence's grammar back while a thinking model reasons (vLLM's ``should_advance`` /
``should_fill_bitmask`` with a reasoning parser): until the output ends with the reasoning's end marker, the
grammar's mask is not applied and its matcher is not advanced; from the next token on, the grammar applies."""

from __future__ import annotations


class ReasoningGate:
    """Follows one sequence's output tokens until they end with ``end_ids`` (the end marker's token ids)."""

    __slots__ = ("end_ids", "tail")

    def __init__(self, end_ids: tuple[int, ...]):
        self.end_ids = end_ids
        self.tail: tuple[int, ...] = ()  # the newest output tokens, at most len(end_ids)

    def push(self, token_id: int) -> bool:
        """Take the next output token; True once the output ends with the end marker (the gate opens)."""
        self.tail = (self.tail + (token_id,))[-len(self.end_ids):]
        return self.tail == self.end_ids
