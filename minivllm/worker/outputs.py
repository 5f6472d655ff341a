"""What the worker hands back to the engine for one step: the sampled tokens and their logprobs, on the host."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SampledTokens:
    """Host-side sampler results for the rows sampled in one step (batch order).

    One token per row, or (speculative decoding: ``row_starts`` set) each row's new tokens, the drafts it accepted
    and the token sampled after them: row ``r``'s are ``token_ids[row_starts[r]:row_starts[r + 1]]``, and the
    per-token lists (``logprobs``, ``top_ids``, ...) are indexed the same way.
    """

    token_ids: list[int]
    logprobs: list[float] | None = None  # logprob of each sampled token
    top_ids: list[list[int]] | None = None  # [rows][k] top alternatives
    top_logprobs: list[list[float]] | None = None
    num_top: list[int] | None = None  # how many alternatives each row asked for (None: no logprobs, -1: all)
    chosen_ids: list[list[int] | None] | None = None  # each row's logprob_token_ids (None: its top num_top)
    chosen_logprobs: list[list[float]] | None = None  # [rows][M]: the logprobs at those ids
    # (seq_id, first prompt token, [{target: Logprob, alt: Logprob, ...}, ...]) of the rows with prompt logprobs
    prompt_logprobs: list[tuple[int, int, list[dict]]] | None = None
    row_starts: list[int] | None = None  # [rows + 1]: each row's first new token (speculative decoding)
    # [rows][<= k]: the drafts proposed after each row's new tokens, for the next step (speculative decoding)
    draft_token_ids: list[list[int]] | None = None
    num_draft_tokens: int = 0  # drafts the step verified (the acceptance metrics' denominators)
    num_drafts: int = 0  # rows that verified drafts
    # [k]: how many rows accepted their draft at each position (``vllm:spec_decode_num_accepted_tokens_per_pos``)
    accepted_per_pos: list[int] | None = None

    def tokens_of(self, row: int) -> list[int]:
        """Row ``row``'s new tokens (one without speculative decoding)."""
        if self.row_starts is None:
            return [self.token_ids[row]]
        return self.token_ids[self.row_starts[row]:self.row_starts[row + 1]]

    def new_tokens(self) -> list[list[int]] | list[int]:
        """Each row's new tokens: a list per row with speculative decoding, else one token per row."""
        if self.row_starts is None:
            return self.token_ids
        return [self.tokens_of(r) for r in range(len(self.row_starts) - 1)]

    def logprobs_of(self, row: int, j: int = 0) -> dict[int, float] | None:
        """``{sampled_id: logprob, alt_id: logprob, ...}`` of row ``row``'s ``j``-th new token when the row asked for
        logprobs, else None: the sampled token first, then its ``logprob_token_ids`` in their order, or its top
        alternatives in descending order."""
        if self.logprobs is None or self.num_top is None or self.num_top[row] is None:
            return None
        i = row if self.row_starts is None else self.row_starts[row] + j
        d = {self.token_ids[i]: self.logprobs[i]}
        chosen = self.chosen_ids[row] if self.chosen_ids is not None else None
        if chosen is not None:
            alternatives = zip(chosen, self.chosen_logprobs[i])
        else:
            k = self.num_top[row]
            k = len(self.top_ids[i]) if k < 0 else k
            alternatives = zip(self.top_ids[i][:k], self.top_logprobs[i][:k])
        for tid, lp in alternatives:
            d.setdefault(tid, lp)
        return d
