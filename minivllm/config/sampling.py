"""Engine-wide sampling settings beyond a request's own parameters: the output watermark (vLLM's
``--watermark-config``; the algorithm is ``minivllm.sample.watermark``'s)."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.fields import arg, at_least, json_config
from minivllm.config.reasoning import ReasoningConfig

#: the keys of ``--watermark-config`` this engine implements (vLLM's names)
WATERMARK_ALGORITHMS = ("gumbel",)
DEDUPLICATE_SCOPES = ("none", "single_turn")


@dataclass(frozen=True)
class WatermarkConfig:
    """A keyed Gumbel-max watermark (Aaronson's scheme, as vLLM's ``gumbel`` algorithm): a random row draws its
    token as ``argmax(l + G)`` where the Gumbel noise ``G[t]`` is a pseudorandom function of the secret ``key``,
    the ``context_width`` tokens generated before it and ``t``. The output keeps the model's distribution, yet
    whoever holds the key can test a text for it (``minivllm.sample.watermark.detect``).

    ``deduplicate_contexts``: ``single_turn`` samples without the watermark a token whose context already
    occurred among the request's last ``deduplicate_contexts_max_history`` generated positions (``None``: all of
    them), since a repeated context would repeat its token (a loop); ``none`` never does.
    """

    key: int
    algorithm: str = "gumbel"
    context_width: int = 4
    deduplicate_contexts: str = "single_turn"
    deduplicate_contexts_max_history: int | None = 8192

    def __post_init__(self) -> None:
        if isinstance(self.key, bool) or not isinstance(self.key, int) or not 0 <= self.key < 2**64:
            raise ValueError(f"watermark_config.key must be an integer in [0, 2**64), got {self.key!r}")
        if self.algorithm not in WATERMARK_ALGORITHMS:
            raise ValueError(f"watermark_config.algorithm must be one of {', '.join(map(repr, WATERMARK_ALGORITHMS))}"
                             f", got {self.algorithm!r}")
        if isinstance(self.context_width, bool) or not isinstance(self.context_width, int):
            raise ValueError(f"watermark_config.context_width must be an integer, got {self.context_width!r}")
        at_least("watermark_config.context_width", self.context_width, 1)
        if self.deduplicate_contexts not in DEDUPLICATE_SCOPES:
            raise ValueError("watermark_config.deduplicate_contexts must be one of "
                             f"{', '.join(map(repr, DEDUPLICATE_SCOPES))}, got {self.deduplicate_contexts!r}")
        history = self.deduplicate_contexts_max_history
        if history is not None:
            if isinstance(history, bool) or not isinstance(history, int):
                raise ValueError(f"watermark_config.deduplicate_contexts_max_history must be an integer or None, "
                                 f"got {history!r}")
            at_least("watermark_config.deduplicate_contexts_max_history", history, 1)

    @classmethod
    def of(cls, value: WatermarkConfig | dict | str) -> WatermarkConfig:
        """From a config, a dict or its JSON text (the flag's value)."""
        return json_config(cls, value, "watermark_config", required=("key",))

    def history(self) -> int:
        """How many of a sequence's newest generated tokens its sampling reads: its context, and the contexts
        of the positions deduplication compares with (with no limit, a count no output reaches)."""
        if self.deduplicate_contexts == "none":
            return self.context_width
        if self.deduplicate_contexts_max_history is None:
            return 2**31
        return self.deduplicate_contexts_max_history + self.context_width


@dataclass
class SamplingConfig:
    """Engine-wide sampling: ``watermark_config`` (None: no watermark) and ``reasoning_config`` (the markers of
    a thinking model's reasoning, for ``thinking_token_budget``; None: none)."""

    watermark_config: str | dict | WatermarkConfig | None = arg(
        None, "watermark the sampled text, as vLLM's flag: a JSON object such as "
              "'{\"algorithm\": \"gumbel\", \"key\": 42}' (keys: key, the secret integer; algorithm: gumbel; "
              "context_width: the generated tokens the noise depends on, 4; deduplicate_contexts: single_turn or "
              "none; deduplicate_contexts_max_history: 8192). Random rows are watermarked, greedy ones are not; "
              "a request opts out with watermarking: false")

    reasoning_config: str | dict | ReasoningConfig | None = arg(
        None, "where a thinking model's reasoning starts and ends, as vLLM's flag: a JSON object such as "
              "'{\"reasoning_start_str\": \"<think>\", \"reasoning_end_str\": \"</think>\"}'; a request's "
              "thinking_token_budget caps the tokens between them. minivllm serve derives it from "
              "--reasoning-parser when not given")

    def __post_init__(self) -> None:
        if self.watermark_config is not None:
            self.watermark_config = WatermarkConfig.of(self.watermark_config)
        if self.reasoning_config is not None:
            self.reasoning_config = ReasoningConfig.of(self.reasoning_config)
