"""Per-request sampling parameters (the vLLM / OpenAI set), validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from minivllm.config.fields import check_types
from minivllm.structured_outputs_params import StructuredOutputsParams

__all__ = ["MAX_LOGPROB_TOKEN_IDS", "ParameterError", "SamplingParams", "StructuredOutputsParams", "truncate_prompt"]

#: most ids in ``logprob_token_ids`` (vLLM's bound)
MAX_LOGPROB_TOKEN_IDS = 128


class ParameterError(ValueError):
    """A ValueError about one request parameter, named by ``parameter`` (the server's 400 names it), for messages
    that do not start with the parameter's name (vLLM's wording, which clients match on)."""

    def __init__(self, message: str, parameter: str | None = None):
        super().__init__(message)
        self.parameter = parameter  # NOTE: in __dict__, so it survives pickling (Ray Serve replicas)


@dataclass
class SamplingParams:
    """How to pick the tokens of one request.

    Filters apply in this order to the row's logits: penalties (repetition, presence,
    frequency), temperature, then top-k, top-p and min-p on the resulting distribution.
    ``temperature == 0`` means greedy (argmax); the other filters then do not matter.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    # False: a random request of an engine with a watermark (``--watermark-config``) samples without it; None
    # (the default) and True: with it (vLLM's)
    watermarking: bool | None = None
    # at most this many tokens of reasoning (between --reasoning-config's markers), then its end is forced; None
    # (or -1, vLLM's "unlimited"): no cap
    thinking_token_budget: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None  # the logprobs of these ids at each generated token (vLLM's)
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    # which end truncate_prompt_tokens cuts: left (None too, as vLLM) keeps the last N tokens, right the first N
    truncation_side: str | None = "left"
    structured_outputs: StructuredOutputsParams | None = None
    _stop: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        check_types(self)  # NOTE: first: a wrong type gets a ValueError naming the parameter, not a TypeError
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k not in (-1, 0)):
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k!r}")
        if self.top_k == 0:  # OpenAI-style clients send 0 for "off"
            self.top_k = -1
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        # how many alternatives: -1 is the whole vocabulary; the engine's max_logprobs bounds them
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and k < 0 and k != -1:
                raise ValueError(f"{name} must be non-negative or -1, got {k}")
        budget = self.thinking_token_budget
        if budget is not None and (not _is_int(budget) or budget < -1):
            raise ParameterError("`thinking_token_budget` must be a non-negative integer or -1 for unlimited.",
                                 "thinking_token_budget")
        if budget == -1:
            self.thinking_token_budget = None
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) or s == "" for s in stop):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        self._stop = stop
        ids = list(self.stop_token_ids or [])
        if any(not isinstance(t, int) or t < 0 for t in ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        self.stop_token_ids = ids
        self._check_logprob_token_ids()
        self._check_token_edits()
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(f"truncate_prompt_tokens must be an integer >= 1, got {self.truncate_prompt_tokens}")
        if self.truncation_side not in (None, "left", "right"):
            raise ValueError(f"truncation_side must be 'left' or 'right', got {self.truncation_side!r}")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams, got "
                             f"{type(self.structured_outputs).__name__}")

    def _check_logprob_token_ids(self) -> None:
        """``logprob_token_ids``: at most ``MAX_LOGPROB_TOKEN_IDS`` ids, whose logprobs replace the top-k
        alternatives; ``logprobs``, if set too, must count them (vLLM's rules and words)."""
        ids = self.logprob_token_ids
        if ids is None:
            return
        if not isinstance(ids, (list, tuple)) or not ids or any(not _is_int(t) for t in ids):
            raise ValueError(f"logprob_token_ids must be a non-empty list of token ids, got {ids!r}")
        if len(ids) > MAX_LOGPROB_TOKEN_IDS:
            raise ParameterError(f"Requested logprob_token_ids of length {len(ids)}, which is greater than max "
                                 f"allowed: {MAX_LOGPROB_TOKEN_IDS}", "logprob_token_ids")
        if self.logprobs is not None and self.logprobs != len(ids):
            raise ParameterError(f"When both logprobs and logprob_token_ids are set, logprobs must equal "
                                 f"len(logprob_token_ids). Got logprobs={self.logprobs}, "
                                 f"len(logprob_token_ids)={len(ids)}.", "logprob_token_ids")
        self.logprob_token_ids = [int(t) for t in ids]

    def _check_token_edits(self) -> None:
        """``logit_bias`` ({token id: bias in [-100, 100]}), ``allowed_token_ids`` and ``bad_words``."""
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a dict of token id to bias, got {type(self.logit_bias).__name__}")
            # every bad key (and value) named at once, not only the first
            keys = [k for k in self.logit_bias if not _is_int(k) or k < 0]
            if keys:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {keys!r}")
            values = {k: v for k, v in self.logit_bias.items() if not _is_real(v) or not -100.0 <= v <= 100.0}
            if values:
                raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {values!r} (token: bias)")
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()} or None
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if not isinstance(ids, (list, tuple)) or not ids or any(not _is_int(t) or t < 0 for t in ids):
                raise ValueError(f"allowed_token_ids must be a non-empty list of token ids, got {ids!r}")
            self.allowed_token_ids = [int(t) for t in ids]
        if self.bad_words is not None:
            words = self.bad_words
            if not isinstance(words, (list, tuple)) or any(not isinstance(w, str) or not w.strip() for w in words):
                raise ValueError(f"bad_words must be a list of non-blank strings, got {words!r}")
            self.bad_words = list(words) or None

    def truncate(self, token_ids: list[int]) -> list[int]:
        """The prompt's token ids cut to ``truncate_prompt_tokens`` on ``truncation_side``."""
        return truncate_prompt(token_ids, self.truncate_prompt_tokens, self.truncation_side or "left")

    @property
    def stop_strings(self) -> list[str]:
        return self._stop

    @property
    def num_logprobs(self) -> int | None:
        """The alternatives each generated token reports (None: no logprobs): ``logprobs``, or as many as
        ``logprob_token_ids`` names (as vLLM's ``SamplingParams.num_logprobs``)."""
        if self.logprobs is not None:
            return self.logprobs
        return len(self.logprob_token_ids) if self.logprob_token_ids else None

    @property
    def has_penalties(self) -> bool:
        """Whether sampling reads the request's token values (repetition / presence / frequency)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def edits_logits(self) -> bool:
        """Whether ``logit_bias``, ``allowed_token_ids`` or ``bad_words`` change the row's logits."""
        return bool(self.logit_bias or self.allowed_token_ids or self.bad_words)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def truncate_prompt(token_ids: list[int], keep: int | None, side: str = "left") -> list[int]:
    """The last ``keep`` of ``token_ids`` (``side`` left: the start is cut, as vLLM by default) or the first
    ``keep`` (right); all of them when ``keep`` is None."""
    if keep is None or keep >= len(token_ids):
        return token_ids
    return token_ids[-keep:] if side == "left" else token_ids[:keep]


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
