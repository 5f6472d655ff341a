"""Speculative decoding (vLLM's ``speculative_config``): which proposer drafts tokens, and how many per step.

``LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": 4})`` or
``minivllm serve MODEL --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'``. The keys and
their meanings are vLLM's; see docs/speculative-decoding.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.fields import at_least, json_config

#: the proposers the engine knows (vLLM's method names)
SPECULATIVE_METHODS = ("ngram", "eagle", "eagle3", "draft_model")
#: the n-gram lengths prompt lookup tries when neither bound is given (vLLM's default)
DEFAULT_PROMPT_LOOKUP = 5


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"speculative_config.{name} must be an integer, got {value!r}")
    at_least(f"speculative_config.{name}", value, minimum)


@dataclass
class SpeculativeConfig:
    """How the engine speculates: each decode step a proposer drafts up to ``num_speculative_tokens`` tokens per
    sequence and one forward of the target model verifies them (greedy outputs are unchanged; random ones keep
    the target's distribution).

    ``method``: ``ngram`` (prompt lookup: the tokens that followed the newest earlier occurrence of the
    sequence's last ``prompt_lookup_max`` .. ``prompt_lookup_min`` tokens; no model), ``eagle`` / ``eagle3`` (a
    draft head at ``model`` reading the target's hidden states), ``draft_model`` (a small model at ``model`` with
    the target's tokenizer). Left out, it is inferred from ``model``'s name (``eagle3``, ``eagle``, else
    ``draft_model``). ``disable_by_batch_size``: no sequence drafts in a step that schedules more sequences than
    this (None: never disabled).
    """

    method: str | None = None
    num_speculative_tokens: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None
    draft_tensor_parallel_size: int | None = None
    disable_by_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.method is None:
            if self.model is None:
                raise ValueError("speculative_config needs a method (one of "
                                 f"{', '.join(map(repr, SPECULATIVE_METHODS))}) or a draft model")
            name = self.model.lower()
            self.method = "eagle3" if "eagle3" in name else "eagle" if "eagle" in name else "draft_model"
        if self.method == "[ngram]":  # vLLM's older spelling
            self.method = "ngram"
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_config.method must be one of {', '.join(map(repr, SPECULATIVE_METHODS))}"
                             f", got {self.method!r}")
        if self.num_speculative_tokens is None:
            raise ValueError("speculative_config needs num_speculative_tokens")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1)
        if self.method == "ngram":
            if self.model is not None:
                raise ValueError("speculative_config.model is not used by method 'ngram' (prompt lookup needs no "
                                 "model)")
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            if lo is None and hi is None:
                lo = hi = DEFAULT_PROMPT_LOOKUP
            lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)
            _check_int("prompt_lookup_min", lo, 1)
            _check_int("prompt_lookup_max", hi, 1)
            if lo > hi:
                raise ValueError(f"speculative_config.prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
            self.prompt_lookup_min, self.prompt_lookup_max = lo, hi
        else:
            if self.model is None:
                raise ValueError(f"speculative_config.method {self.method!r} needs a model (the draft checkpoint's "
                                 "folder)")
            if not isinstance(self.model, str):
                raise ValueError(f"speculative_config.model must be a path, got {self.model!r}")
            for name in ("prompt_lookup_min", "prompt_lookup_max"):
                if getattr(self, name) is not None:
                    raise ValueError(f"speculative_config.{name} is only used by method 'ngram'")
        if self.draft_tensor_parallel_size is not None:
            _check_int("draft_tensor_parallel_size", self.draft_tensor_parallel_size, 1)
        if self.disable_by_batch_size is not None:
            _check_int("disable_by_batch_size", self.disable_by_batch_size, 1)

    @classmethod
    def of(cls, value: SpeculativeConfig | dict | str) -> SpeculativeConfig:
        """From a config, a dict or its JSON text (the flag's value)."""
        return json_config(cls, value, "speculative_config")

    @property
    def uses_model(self) -> bool:
        """The proposer runs a network of its own (EAGLE heads, draft models), not a lookup."""
        return self.method != "ngram"
