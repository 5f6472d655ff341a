"""The n-gram proposer (prompt lookup, vLLM's ``method="ngram"``): draft the tokens that followed the newest
earlier occurrence of a sequence's last tokens.

For a row whose tokens (prompt and output so far) are ``s[0:L]``, the proposer takes the longest ``n`` in
``prompt_lookup_max .. prompt_lookup_min`` whose suffix ``s[L-n:L]`` occurs earlier in the sequence (an
occurrence ``s[i:i+n]`` with ``i + n < L``, so that at least one token follows it), the most recent such
occurrence (the largest ``i``), and drafts the up to ``k`` tokens ``s[i+n : min(i+n+k, L)]`` that followed it.
No match: no drafts.

Vectorized over rows and positions with numpy: for every end position ``e`` of a candidate occurrence, the
length of the common suffix of ``s[:e+1]`` and ``s[:L]`` (capped at ``prompt_lookup_max``) grows by one
whole-array comparison per token of the suffix; the longest match and its newest end are two reductions.
"""

from __future__ import annotations

import numpy as np


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class NgramProposer:
    """Prompt-lookup drafts of ``num_speculative_tokens`` tokens from n-grams of ``prompt_lookup_min`` to
    ``prompt_lookup_max`` tokens (the longest match wins, then the most recent occurrence)."""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.num_speculative_tokens = _check_count("num_speculative_tokens", num_speculative_tokens, 1)
        self.prompt_lookup_min = _check_count("prompt_lookup_min", prompt_lookup_min, 1)
        self.prompt_lookup_max = _check_count("prompt_lookup_max", prompt_lookup_max, 1)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min ({prompt_lookup_min}) must be <= prompt_lookup_max "
                             f"({prompt_lookup_max})")

    def propose(self, token_ids: np.ndarray, num_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(drafts [rows, k] int32, num_drafts [rows] int32)`` for the rows of ``token_ids`` ([rows, max_len];
        row ``r``'s sequence is its first ``num_tokens[r]`` entries). Entries of a row past its
        ``num_drafts`` are 0."""
        token_ids = np.asarray(token_ids)
        num_tokens = np.asarray(num_tokens)
        if token_ids.ndim != 2 or not np.issubdtype(token_ids.dtype, np.integer):
            raise ValueError(f"token_ids must be a 2-D integer array, got shape {token_ids.shape} "
                             f"of {token_ids.dtype}")
        rows, max_len = token_ids.shape
        if num_tokens.shape != (rows,) or not np.issubdtype(num_tokens.dtype, np.integer):
            raise ValueError(f"num_tokens must be an integer array of shape ({rows},), got shape "
                             f"{num_tokens.shape} of {num_tokens.dtype}")
        if rows and (num_tokens.min() < 0 or num_tokens.max() > max_len):
            raise ValueError(f"num_tokens must lie in [0, {max_len}] (the width of token_ids)")
        k = self.num_speculative_tokens
        drafts = np.zeros((rows, k), dtype=np.int32)
        num_drafts = np.zeros(rows, dtype=np.int32)
        width = int(num_tokens.max()) if rows else 0
        if width < 2:  # a match needs one token after it and one in it
            return drafts, num_drafts

        toks = token_ids[:, :width]  # [rows, W]
        lengths = num_tokens.astype(np.int64)  # [rows]
        depth = min(self.prompt_lookup_max, width - 1)  # no match is longer than W - 1 tokens
        back = lengths[:, None] - 1 - np.arange(depth)[None, :]  # [rows, depth]: index of the suffix's t-th last
        suffix = np.take_along_axis(toks, np.clip(back, 0, None), axis=1)  # [rows, depth]
        suffix_ok = back >= 0  # [rows, depth]: the sequence has a t-th last token

        # match[r, e]: how many tokens ending at e equal the tokens ending at L-1 (the candidate e <= L-2)
        matching = np.arange(width)[None, :] <= lengths[:, None] - 2  # [rows, W] bool
        match = np.zeros((rows, width), dtype=np.int32)  # [rows, W]
        for t in range(depth):
            equal = np.zeros((rows, width), dtype=bool)  # [rows, W]: s[e - t] == s[L - 1 - t]
            equal[:, t:] = (toks[:, :width - t] == suffix[:, t:t + 1]) & suffix_ok[:, t:t + 1]
            matching &= equal
            if not matching.any():
                break
            match += matching

        best = match.max(axis=1)  # [rows]: the longest suffix n-gram that occurred earlier
        found = best >= self.prompt_lookup_min  # [rows]
        newest = width - 1 - np.argmax((match >= best[:, None])[:, ::-1], axis=1)  # [rows]: its newest end
        start = newest + 1  # [rows]: the first token that followed it
        num_drafts = np.where(found, np.minimum(k, lengths - start), 0).astype(np.int32)
        follow = np.take_along_axis(toks, np.clip(start[:, None] + np.arange(k)[None, :], 0, width - 1), axis=1)
        drafts = np.where(np.arange(k)[None, :] < num_drafts[:, None], follow, 0).astype(np.int32)  # [rows, k]
        return drafts, num_drafts
