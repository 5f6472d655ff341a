"""What the engine hands back: per-request outputs and per-step statistics. Plain dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class Logprob(NamedTuple):
    """A prompt token's (or an alternative's) logprob and its 1-based rank in the distribution."""

    logprob: float
    rank: int


@dataclass
class CompletionOutput:
    """One completion of a request (``n`` of them when ``SamplingParams.n > 1``)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    logprobs: list[dict[int, float]] | None = None  # per token: {token_id: logprob}, sampled one first
    delta_text: str = ""  # text added by the latest step (streaming)
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[dict[int, float]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class PhaseTimes(NamedTuple):
    """A request's phases in seconds, as vLLM measures them (None where a timestamp is missing): ``queue`` from
    added to first scheduled, ``prefill`` from scheduled to the first token, ``decode`` from the first token to the
    latest, ``inference`` from scheduled to the latest token (preemptions included)."""

    queue: float | None
    prefill: float | None
    decode: float | None
    inference: float | None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    # the engine's time.monotonic(): added, first scheduled, first and latest token, ended
    arrival_time: float = 0.0
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0  # of its sequences, in all
    max_tokens: int | None = None  # the request's
    # with SamplingParams.prompt_logprobs: per prompt token {its id: Logprob, top-k ids: Logprob}; None for the first
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    def phase_times(self) -> PhaseTimes:
        """The request's queue, prefill, decode and inference times (seconds)."""
        def span(start: float | None, end: float | None) -> float | None:
            return None if start is None or end is None else max(0.0, end - start)

        queued, scheduled = self.arrival_time or None, self.scheduled_time
        first, last = self.first_token_time, self.last_token_time
        return PhaseTimes(span(queued, scheduled), span(scheduled, first), span(first, last), span(scheduled, last))

    def to_dict(self) -> dict:
        """The ``LLM.generate`` result: the first completion's text and ids, plus all completions."""
        first = self.outputs[0]
        d = {"text": first.text, "token_ids": list(first.token_ids), "finish_reason": first.finish_reason}
        if first.logprobs is not None:
            d["logprobs"] = first.logprobs
        if self.prompt_logprobs is not None:
            d["prompt_logprobs"] = self.prompt_logprobs
        if len(self.outputs) > 1:
            d["outputs"] = [{"text": o.text, "token_ids": list(o.token_ids), "finish_reason": o.finish_reason,
                             **({"logprobs": o.logprobs} if o.logprobs is not None else {})}
                            for o in self.outputs]
        return d


@dataclass
class StepStats:
    """What one ``LLMEngine.step()`` did; the progress bar and the server's metrics read it."""

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_preempted: int = 0
    num_scheduled_seqs: int = 0  # rows in this step's batch
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefix_cache_hit_tokens: int = 0
    prefix_cache_query_tokens: int = 0
    step_time: float = 0.0
    # speculative decoding, of the step results this call reported: rows that verified drafts, the drafts, those
    # accepted, and those accepted at each draft position (vLLM's ``vllm:spec_decode_*`` counters)
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()

    @property
    def kv_cache_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0
