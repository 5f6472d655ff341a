"""When a sequence stops: stop token ids, EOS, max_tokens, max_model_len (stop strings are the detokenizer's)."""

from __future__ import annotations

from minivllm.core.sequence import Sequence


def ends_by_length(seq: Sequence, max_model_len: int) -> bool:
    """Whether the sequence, with its pending tokens, has reached max_tokens or max_model_len."""
    max_tokens = seq.sampling_params.max_tokens
    return ((max_tokens is not None and seq.num_completion_tokens >= max_tokens)
            or seq.num_tokens >= max_model_len)


def draft_room(seq: Sequence, budget: int, max_model_len: int) -> int:
    """How many drafts a decode row of ``seq`` may compute after its newest token: within ``budget`` tokens, and
    no more than ``max_tokens`` and ``max_model_len`` leave room for."""
    room = min(budget, max_model_len - seq.num_tokens)
    max_tokens = seq.sampling_params.max_tokens
    if max_tokens is not None:
        room = min(room, max_tokens - seq.num_completion_tokens)
    return max(0, room - 1)


def check_stop(seq: Sequence, token_id: int, max_model_len: int, eos_token_ids: set[int]) -> str | None:
    """Why ``seq`` stops at its newest known token ``token_id``: "stop", "length", or None (it goes on)."""
    params = seq.sampling_params
    num_completion = seq.num_known_completion_tokens
    if num_completion >= params.min_tokens:
        if token_id in params.stop_token_ids:
            return "stop"
        if not params.ignore_eos and token_id in eos_token_ids:
            return "stop"
    if params.max_tokens is not None and num_completion >= params.max_tokens:
        return "length"
    if seq.num_known_tokens >= max_model_len:
        return "length"
    return None
