"""Per-request sampling parameters (the vLLM / OpenAI set), validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from minivllm.config.fields import check_types


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
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
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
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs must be an integer in [0, 20], got {self.logprobs!r}")
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

    @property
    def stop_strings(self) -> list[str]:
        return self._stop

    @property
    def has_penalties(self) -> bool:
        """Whether sampling reads the request's token values (repetition / presence / frequency)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0
