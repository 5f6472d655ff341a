"""Pydantic models of the OpenAI-compatible API's requests: OpenAI fields plus vLLM's extras, output constraints
and tools included (``structured.py`` turns those into a grammar; ``responses.py`` has the responses)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from minivllm.engine.tokenizer import chat_template_args, refuse_media_parts
from minivllm.sampling_params import SamplingParams, StructuredOutputsParams

# ---------------------------------------------------------------- output constraints and tools


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: OpenAI's named schema."""

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: ``text``, ``json_object`` or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(BaseModel):
    """vLLM's ``structured_outputs`` extra field."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = True


class FunctionDefinition(BaseModel):
    """A tool's function: its name, what it does, and the JSON schema of its arguments."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


# ------------------------------------------------------------------------------- requests


class StreamOptions(BaseModel):
    """``include_usage``: a last chunk with the usage; ``continuous_usage_stats`` (vLLM): usage in every chunk."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingRequest(BaseModel):
    """Fields shared by completions and chat completions; ``None`` means "the default"."""

    model: str | None = None
    n: int = 1
    best_of: int | None = None  # accepted when equal to n, or as the beam width with use_beam_search
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # an int64, as vLLM's
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
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    # the logprobs of these token ids at each generated token, in place of the top ones (with logprobs)
    logprob_token_ids: list[int] | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool | None = None  # None: the server's --return-tokens-as-token-ids
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None  # left (default) keeps the last N tokens, right the first
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    # vLLM's beam search (``beam_search.py``): the n best of best_of (default n) beams
    use_beam_search: bool = False
    length_penalty: float = 1.0
    watermarking: bool | None = None  # false: sample without the server's --watermark-config (vLLM's)
    # vLLM's: at most this many tokens of reasoning, then its end is forced (-1: no cap; needs --reasoning-config
    # or --reasoning-parser)
    thinking_token_budget: int | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage in every chunk: ``continuous_usage_stats`` together with ``include_usage`` (as in vLLM)."""
        return self.include_usage and self.stream_options.continuous_usage_stats

    def token_bias(self) -> dict[int, float] | None:
        """``logit_bias`` with its keys as token ids (OpenAI sends them as strings); every key that is not one named,
        in vLLM's words."""
        if self.logit_bias is None:
            return None
        bias, bad = {}, []
        for key, value in self.logit_bias.items():
            try:
                bias[int(key)] = value
            except ValueError:
                bad.append(key)
        if bad:
            raise ValueError(f"logit_bias contains key(s) that cannot be converted to integer token IDs: {bad!r}")
        return bias

    def to_sampling_params(self, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None,
                           structured_outputs: StructuredOutputsParams | None = None) -> SamplingParams:
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
            include_stop_str_in_output=self.include_stop_str_in_output,
            logprobs=None if self.logprob_token_ids else logprobs, logprob_token_ids=self.logprob_token_ids,
            skip_special_tokens=self.skip_special_tokens, logit_bias=self.token_bias(),
            allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
            prompt_logprobs=self.prompt_logprobs if prompt_logprobs is None else prompt_logprobs,
            truncate_prompt_tokens=self.truncate_prompt_tokens, truncation_side=self.truncation_side or "left",
            structured_outputs=structured_outputs, watermarking=self.watermarking,
            thinking_token_budget=self.thinking_token_budget)


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``: prompt as text, texts, token ids or lists of token ids."""

    # tried left to right, strict ints first: a long list of ids validates quickly, and a list of digit
    # strings stays text; a missing one gets vLLM's error, as an empty one does (serving_completion)
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]] | None = Field(None, union_mode="left_to_right")
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None


class ChatMessage(BaseModel):
    """One chat message; content is a string or a list of ``{"type": "text", "text": ...}`` parts."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None

    def to_template(self) -> dict[str, Any]:
        """The message as the chat template expects it: text parts joined, and the arguments of an assistant's
        ``tool_calls`` as objects (OpenAI sends them as JSON text; templates write them out as JSON), and the
        deprecated ``reasoning_content`` under its vLLM 0.33 name ``reasoning``."""
        d = self.model_dump(exclude_none=True)
        if "reasoning_content" in d:
            d.setdefault("reasoning", d.pop("reasoning_content"))
        calls = d.get("tool_calls")
        if calls is not None:
            d["tool_calls"] = [_template_call(c) for c in calls] if isinstance(calls, list) else calls
        if isinstance(self.content, list):
            refuse_media_parts([{"content": self.content}])  # an image_url part: no encoder for it
            if any(not isinstance(p.get("text"), str) for p in self.content):
                raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
            d["content"] = "".join(p["text"] for p in self.content)
        d.setdefault("content", "")
        return d


def _template_call(call: Any) -> Any:
    """An assistant's tool call with its ``function.arguments`` parsed (ValueError naming the field if not JSON);
    empty arguments are a call without arguments (``{}``), as vLLM reads them."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        args = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
    except ValueError:
        raise ValueError(f"messages: tool_calls arguments must be JSON text, got {fn['arguments']!r}") from None
    return {**call, "function": {**fn, "arguments": args}}


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    # vLLM extras
    echo: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    include_reasoning: bool = True
    """vLLM's: false leaves the reasoning (``--reasoning-parser``) out of the response; its tokens still count in
    ``usage.completion_tokens_details.reasoning_tokens``."""

    @property
    def effective_tool_choice(self) -> ToolChoice:
        """``tool_choice``, defaulting as OpenAI does: ``auto`` with tools, ``none`` without."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def template_args(self) -> dict[str, Any]:
        """The chat template's arguments of this request (ValueError naming the field for a contradiction); the
        tools go to the template whatever the tool choice, as in vLLM."""
        args = chat_template_args(self.add_generation_prompt, self.continue_final_message, self.chat_template,
                                  self.chat_template_kwargs, self.messages[-1].role)
        if self.tools:
            args["tools"] = [t.model_dump(exclude_none=True) for t in self.tools]
        return args


class BatchChatCompletionRequest(ChatCompletionRequest):
    """``POST /v1/chat/completions/batch`` (vLLM's): a chat completion's fields, with ``messages`` a list of
    conversations; the response has one choice per conversation, in their order. Not streamed, one completion per
    conversation, no tools (the handler refuses them, naming the field)."""

    messages: list[list[ChatMessage]] = Field(min_length=1)

    def conversation(self, i: int) -> ChatCompletionRequest:
        """The chat completion request of conversation ``i`` (the fields are validated already)."""
        fields = {name: getattr(self, name) for name in ChatCompletionRequest.model_fields}
        return ChatCompletionRequest.model_construct(**{**fields, "messages": self.messages[i]})


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: either ``prompt`` or chat ``messages`` (vLLM's shape)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # vLLM's defaults: True for a prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: token ids to text."""

    model: str | None = None
    tokens: list[int]


class LoadLoRAAdapterRequest(BaseModel):
    """``POST /v1/load_lora_adapter`` (vLLM's shape): serve the PEFT folder ``lora_path`` as model ``lora_name``."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoRAAdapterRequest(BaseModel):
    """``POST /v1/unload_lora_adapter`` (vLLM's shape): stop serving the adapter ``lora_name``."""

    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None  # vLLM's field, accepted and unused: the name says which adapter
