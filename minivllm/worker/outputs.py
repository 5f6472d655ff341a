"""What the worker hands back to the engine for one step: the sampled tokens and their logprobs, on the host."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SampledTokens:
    """Host-side sampler results for the rows sampled in one step (batch order)."""

    token_ids: list[int]
    logprobs: list[float] | None = None  # logprob of each sampled token
    top_ids: list[list[int]] | None = None  # [rows][k] top alternatives
    top_logprobs: list[list[float]] | None = None
    num_top: list[int] | None = None  # how many alternatives each row asked for (None: no logprobs, -1: all)
    chosen_ids: list[list[int] | None] | None = None  # each row's logprob_token_ids (None: its top num_top)
    chosen_logprobs: list[list[float]] | None = None  # [rows][M]: the logprobs at those ids
    # (seq_id, first prompt token, [{target: Logprob, alt: Logprob, ...}, ...]) of the rows with prompt logprobs
    prompt_logprobs: list[tuple[int, int, list[dict]]] | None = None

    def logprobs_of(self, row: int) -> dict[int, float] | None:
        """``{sampled_id: logprob, alt_id: logprob, ...}`` for a row that asked for logprobs, else None: the sampled
        token first, then its ``logprob_token_ids`` in their order, or its top alternatives in descending order."""
        if self.logprobs is None or self.num_top is None or self.num_top[row] is None:
            return None
        d = {self.token_ids[row]: self.logprobs[row]}
        chosen = self.chosen_ids[row] if self.chosen_ids is not None else None
        if chosen is not None:
            alternatives = zip(chosen, self.chosen_logprobs[row])
        else:
            k = self.num_top[row]
            k = len(self.top_ids[row]) if k < 0 else k
            alternatives = zip(self.top_ids[row][:k], self.top_logprobs[row][:k])
        for tid, lp in alternatives:
            d.setdefault(tid, lp)
        return d
