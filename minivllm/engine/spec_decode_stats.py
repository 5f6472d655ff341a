"""Speculative decoding's counters (vLLM's ``vllm:spec_decode_*`` metrics) and what they give: the acceptance
rate and the mean acceptance length."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeCounters:
    """Counts over verified steps: ``num_drafts`` (rows that verified drafts), ``num_draft_tokens``,
    ``num_accepted_tokens`` and ``per_pos[i]`` (rows that accepted their draft at position ``i``, of ``k``)."""

    k: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.per_pos:
            self.per_pos = [0] * self.k

    def add(self, sampled) -> None:
        """Count one step's results (a ``SampledTokens`` of a speculative step)."""
        self.num_drafts += sampled.num_drafts
        self.num_draft_tokens += sampled.num_draft_tokens
        per_pos = sampled.accepted_per_pos or ()
        self.num_accepted_tokens += sum(per_pos)
        for i, n in enumerate(per_pos):
            self.per_pos[i] += n

    def report(self, stats) -> SpecDecodeCounters:
        """Write the counts into a step's ``StepStats`` (its ``spec_*`` fields); returns fresh counters."""
        stats.spec_num_drafts, stats.spec_num_draft_tokens = self.num_drafts, self.num_draft_tokens
        stats.spec_num_accepted_tokens, stats.spec_accepted_per_pos = self.num_accepted_tokens, tuple(self.per_pos)
        return SpecDecodeCounters(self.k)

    def copy(self) -> SpecDecodeCounters:
        """An independent snapshot of the counts."""
        return SpecDecodeCounters(self.k, self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                                  list(self.per_pos))

    def since(self, earlier: SpecDecodeCounters) -> SpecDecodeCounters:
        """The counts added after ``earlier`` (a ``copy`` taken then)."""
        return SpecDecodeCounters(self.k, self.num_drafts - earlier.num_drafts,
                                  self.num_draft_tokens - earlier.num_draft_tokens,
                                  self.num_accepted_tokens - earlier.num_accepted_tokens,
                                  [a - b for a, b in zip(self.per_pos, earlier.per_pos)])

    def summary(self) -> dict:
        """The counts, the acceptance rate, the mean acceptance length and each position's acceptance rate (of
        the rows that drafted that far: vLLM's per-position rate divides by the drafts)."""
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens, "accepted_per_pos": list(self.per_pos),
                "acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_rate_per_pos": [n / self.num_drafts if self.num_drafts else 0.0 for n in self.per_pos]}

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over proposed drafts (0 when none were proposed)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verifying row gains per step: 1 (the target's own token) plus the drafts it accepts (vLLM's
        definition; 1 when none were proposed)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
