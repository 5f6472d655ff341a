"""Pydantic models of the OpenAI-compatible API's responses, in OpenAI's exact shapes plus vLLM's extra fields
(``stop_reason``, ``token_ids``, ``prompt_token_ids``, ``prompt_logprobs``)."""

from __future__ import annotations

import time
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, Field, PrivateAttr, model_serializer


class PromptTokensDetails(BaseModel):
    """OpenAI's breakdown of the prompt tokens: ``cached_tokens`` came from the prefix cache."""

    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    """OpenAI's breakdown of the completion tokens: ``reasoning_tokens`` were the model's thinking (reported
    when the server has a ``--reasoning-parser``, as vLLM)."""

    reasoning_tokens: int = 0


class UsageInfo(BaseModel):
    """Token counts of a response (in the last stream chunk with ``stream_options.include_usage``, in every
    chunk with ``continuous_usage_stats``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None
    _report_cached: bool = PrivateAttr(False)  # the server reports prefix-cache hits (--enable-prompt-tokens-details)

    @classmethod
    def of(cls, prompt_tokens: int, report_cached: bool = False) -> UsageInfo:
        """The usage of a response that has not generated yet; ``report_cached``: see :meth:`set_cached_tokens`."""
        usage = cls(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
        usage._report_cached = report_cached
        return usage

    def set_cached_tokens(self, cached_tokens: int) -> None:
        """``prompt_tokens_details.cached_tokens`` where the server reports them (0 without a hit); null otherwise,
        as vLLM."""
        report = self._report_cached
        self.prompt_tokens_details = PromptTokensDetails(cached_tokens=cached_tokens) if report else None


class _Sparse(BaseModel):
    """A part of a response of which only the fields that are set are sent."""

    @model_serializer(mode="wrap")
    def _drop_none(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}


class PerRequestMetrics(_Sparse):
    """vLLM's per-request timings (``--enable-per-request-metrics``), in milliseconds; a timing the request has no
    timestamps for is left out."""

    time_to_first_token_ms: float | None = None
    generation_time_ms: float | None = None
    queue_time_ms: float | None = None
    mean_itl_ms: float | None = None
    tokens_per_second: float | None = None


class PromptLogprob(BaseModel):
    """vLLM's prompt logprob entry: a token's logprob, its 1-based rank, and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionLogProbs(BaseModel):
    """Legacy completions logprobs: one entry per token in each list."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    """One completion (``n`` per prompt) or its stream delta."""

    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    """vLLM's extra: the stop token id or stop string that ended the completion (None: EOS or length)."""
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


ChoiceT = TypeVar("ChoiceT")


class _Response(BaseModel, Generic[ChoiceT]):
    """The fields every response and stream chunk has (a subclass fixes ``object``)."""

    id: str
    object: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChoiceT]
    usage: UsageInfo | None = None
    metrics: PerRequestMetrics | None = None  # vLLM's, with --enable-per-request-metrics (left out otherwise)

    @model_serializer(mode="wrap")
    def _drop_no_metrics(self, handler):
        out = handler(self)
        if isinstance(out, dict) and out.get("metrics", ...) is None:
            del out["metrics"]
        return out


class CompletionResponse(_Response[CompletionChoice]):
    """A completion, or one stream chunk of it (then ``usage`` is null but in the last chunk)."""

    object: Literal["text_completion"] = "text_completion"


class TopLogprob(BaseModel):
    """A candidate token with its logprob and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    """The sampled token, with the most likely candidates at its position."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    """Chat logprobs: one ``TokenLogprob`` per generated token."""

    content: list[TokenLogprob] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text of an object


class ToolCall(BaseModel):
    """A call the model made, in OpenAI's shape."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    """The generated message of a chat choice: its text, the model's reasoning (``--reasoning-parser``; the field
    is ``reasoning`` as in vLLM 0.33, which no longer sends ``reasoning_content``) and the tools it called
    (left out when there are none, as vLLM)."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _drop_no_calls(self, handler):
        data = handler(self)
        if not data.get("tool_calls"):
            data.pop("tool_calls", None)
        return data


class DeltaFunctionCall(_Sparse):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Sparse):
    """A piece of a streamed tool call: the first has ``id``, ``type`` and the name; the others more arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class ChatChoice(BaseModel):
    """One chat completion (``n`` per request)."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = Field(None, description="with logprobs=true: the tokens' logprobs")
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    """vLLM's extra, as in ``CompletionChoice``."""
    token_ids: list[int] | None = None


class ChatCompletionResponse(_Response[ChatChoice]):
    """A whole chat completion (not streamed)."""

    object: Literal["chat.completion"] = "chat.completion"
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None


class DeltaMessage(_Sparse):
    """A stream delta: only the fields that are set are sent."""

    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(BaseModel):
    """One choice's delta in a chat stream chunk."""

    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(_Response[ChatChunkChoice]):
    """One server-sent event of a chat stream."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    prompt_token_ids: list[int] | None = None  # the first chunk's, with return_token_ids
