"""What the scheduler decides for one step: which sequences compute how many tokens. Pure Python."""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.engine.sequence import Sequence


@dataclass
class SchedulerOutput:
    """What one step computes: ``(seq, num_new_tokens)`` rows in batch order."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    preempted: list[Sequence] = field(default_factory=list)
    num_cached_tokens: int = 0  # prefix-cache hit tokens of the sequences admitted this step
    num_admitted_tokens: int = 0  # tokens of the sequences admitted this step (hit-rate denominator)

    @property
    def num_batched_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_decode_only(self) -> bool:
        return self.num_prefill_tokens == 0 and self.num_decode_tokens > 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
