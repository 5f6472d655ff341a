"""Pydantic models of the OpenAI-compatible API: requests (OpenAI fields plus vLLM's extras) and
responses in OpenAI's exact shapes."""

from __future__ import annotations

import time
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_serializer

from minivllm.sampling_params import SamplingParams


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions; ``None`` means "the default"."""

    model: str | None = None
    n: int = 1
    best_of: int | None = None  # accepted when equal to n
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted and ignored
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def to_sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        """The engine's SamplingParams (raises ValueError on out-of-range values)."""
        def pick(value, default):
            return default if value is None else value

        return SamplingParams(
            n=self.n, temperature=pick(self.temperature, 1.0), top_p=pick(self.top_p, 1.0),
            top_k=pick(self.top_k, -1), min_p=pick(self.min_p, 0.0),
            repetition_penalty=pick(self.repetition_penalty, 1.0),
            presence_penalty=pick(self.presence_penalty, 0.0), frequency_penalty=pick(self.frequency_penalty, 0.0),
            seed=self.seed, max_tokens=max_tokens, min_tokens=self.min_tokens, ignore_eos=self.ignore_eos,
            stop=self.stop, stop_token_ids=self.stop_token_ids,
            include_stop_str_in_output=self.include_stop_str_in_output, logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens)


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``: prompt as text, texts, token ids or lists of token ids."""

    # NOTE: tried left to right, strict ints first: a list of a million ids validates in milliseconds, and a
    # list of digit strings stays text
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]] = Field(union_mode="left_to_right")
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None


class ChatMessage(BaseModel):
    """One chat message; content is a string or a list of ``{"type": "text", "text": ...}`` parts."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None

    def to_template(self) -> dict[str, Any]:
        """The message as the chat template expects it (text parts joined)."""
        d = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in self.content):
                raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
            d["content"] = "".join(p["text"] for p in self.content)
        d.setdefault("content", "")
        return d


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: either ``prompt`` or chat ``messages`` (vLLM's shape)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: token ids to text."""

    model: str | None = None
    tokens: list[int]


# ----------------------------------------------------------------- responses
class UsageInfo(BaseModel):
    """Token counts of a response (in the last stream chunk with ``stream_options.include_usage``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


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


ChoiceT = TypeVar("ChoiceT")


class _Response(BaseModel, Generic[ChoiceT]):
    """The fields every response and stream chunk has (a subclass fixes ``object``)."""

    id: str
    object: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChoiceT]
    usage: UsageInfo | None = None


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


class AssistantMessage(BaseModel):
    """The generated message of a chat choice."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatChoice(BaseModel):
    """One chat completion (``n`` per request)."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = Field(None, description="with logprobs=true: the tokens' logprobs")
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    """vLLM's extra, as in ``CompletionChoice``."""


class ChatCompletionResponse(_Response[ChatChoice]):
    """A whole chat completion (not streamed)."""

    object: Literal["chat.completion"] = "chat.completion"
    usage: UsageInfo


class DeltaMessage(BaseModel):
    """A stream delta: only the fields that are set are sent."""

    role: str | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    """One choice's delta in a chat stream chunk."""

    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Response[ChatChunkChoice]):
    """One server-sent event of a chat stream."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
