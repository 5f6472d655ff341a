"""What the completion and chat handlers share: the served model, the tokenizer off the event loop, prompts
as token ids, starting engine requests, usage, and logprobs in OpenAI's and vLLM's shapes. The engine is an
``EngineClient`` (``engine/protocol.py``): one engine in this process, or the Ray Serve front's replicas."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi.responses import Response

from minivllm.engine.protocol import EngineClient, OutputStream
from minivllm.entrypoints.openai import protocol as P
from minivllm.entrypoints.openai import responses as R
from minivllm.entrypoints.openai.errors import APIError
from minivllm.entrypoints.openai.inputs import RequestLimits, Tokenization
from minivllm.outputs import RequestOutput
from minivllm.structured_outputs_params import StructuredOutputsParams


def clamp(logprob: float) -> float:
    return max(logprob, -9999.0)  # -inf is not JSON


class ModelResponse(Response):
    """A JSON response that keeps the response model it was made of (``payload``), for a caller that puts several
    together (``/v1/chat/completions/batch``)."""

    def __init__(self, payload):
        super().__init__(payload.model_dump_json(), media_type="application/json")
        self.payload = payload


def json_response(obj) -> ModelResponse:
    return ModelResponse(obj)


@dataclass(frozen=True)
class UsageOptions:
    """How responses report usage (``ServerConfig``, vLLM's flags): ``force_include_usage`` puts it in every chunk
    of every stream and in a last chunk, asked or not; ``prompt_tokens_details`` reports the prefix-cache hits."""

    force_include_usage: bool = False
    prompt_tokens_details: bool = False


def new_usage(prompt_tokens: int = 0, options: UsageOptions = UsageOptions()) -> R.UsageInfo:
    return R.UsageInfo.of(prompt_tokens, report_cached=options.prompt_tokens_details)


def final_usage(finals: list[RequestOutput], options: UsageOptions = UsageOptions()) -> R.UsageInfo:
    """The usage of finished requests: their prompts, every completion's tokens, the prefix-cache hits."""
    usage = new_usage(sum(len(out.prompt_token_ids) for out in finals), options)
    usage.completion_tokens = sum(len(c.token_ids) for out in finals for c in out.outputs)
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
    usage.set_cached_tokens(sum(out.num_cached_tokens for out in finals))
    return usage


@dataclass(frozen=True)
class ChatParsers:
    """How chat outputs are read back: ``tool_call_parser`` (set when ``tool_choice: auto`` is enabled) and
    ``reasoning_parser`` (None: off)."""

    tool_call_parser: str | None = None
    reasoning_parser: str | None = None


class ServingBase:
    """Serves requests on an engine client (once its engine is ready) under one model name."""

    def __init__(self, llm: EngineClient, model_name: str, limits: RequestLimits = RequestLimits(),
                 parsers: ChatParsers = ChatParsers(), usage_options: UsageOptions = UsageOptions()):
        self.llm, self.model_name, self.limits, self.parsers = llm, model_name, limits, parsers
        self.usage_options = usage_options
        self._tokenization: Tokenization | None = None

    @property
    def tokenization(self) -> Tokenization:
        """The engine's tokenizer, used off the event loop (made when the engine is ready)."""
        if self._tokenization is None:
            self.llm.check_usable()
            self._tokenization = Tokenization(self.llm.tokenizer, self.llm.model_info().max_model_len)
        return self._tokenization

    def check_model(self, model: str | None) -> None:
        """404 unless ``model`` is the served name (or omitted)."""
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")

    def token_str(self, token_id: int, as_id: bool = False) -> str:
        """A token's text, or ``"token_id:N"`` (``return_tokens_as_token_ids``)."""
        return f"token_id:{token_id}" if as_id else self.tokenization.decode_now([token_id], skip_special_tokens=False)

    async def prompt_ids(self, prompt: str | list[int], truncate: int | None = None, field: str = "prompt") -> list[int]:
        """A prompt as token ids (the last ``truncate`` of them): text is tokenized off the event loop; ids longer
        than the model's context are refused here, before the engine walks them."""
        if isinstance(prompt, str):
            prompt = await self.tokenization.encode(prompt, field, check_length=truncate is None)
        if truncate is not None:
            prompt = prompt[-truncate:]
        max_model_len = self.llm.model_info().max_model_len
        if len(prompt) >= max_model_len:
            raise APIError(400, f"the prompt has {len(prompt)} tokens, but max_model_len is "
                                f"{max_model_len}: it must be shorter", param=field)
        return prompt

    async def prepare_grammar(self, so: StructuredOutputsParams | None, field: str | None) -> None:
        """Have the engine compile the request's grammar off the event loop (cached by constraint), so it finds it
        ready; a 400 naming ``field`` when the schema, regex or grammar is invalid."""
        if so is None:
            return
        try:
            await self.llm.compile_grammar(so)
        except ValueError as exc:
            raise APIError(400, str(exc).replace("structured_outputs", field, 1), param=field) from None

    async def start(self, prompts: list, params, base_id: str) -> list[OutputStream]:
        """One engine request per prompt (``{base_id}-{i}``); all aborted if one cannot start."""
        streams: list[OutputStream] = []
        try:
            for i, prompt in enumerate(prompts):
                streams.append(await self.llm.add_request(prompt, params, f"{base_id}-{i}"))
        except BaseException:
            for s in streams:
                s.abort()
            raise
        return streams

    def prompt_logprobs(self, out: RequestOutput) -> R.PromptLogprobs | None:
        """vLLM's ``prompt_logprobs``: per prompt token ``{"id": {logprob, rank, decoded_token}}``, None first."""
        if out.prompt_logprobs is None:
            return None
        return [None if entry is None else {
            str(tid): R.PromptLogprob(logprob=clamp(lp.logprob), rank=lp.rank, decoded_token=self.token_str(tid))
            for tid, lp in entry.items()} for entry in out.prompt_logprobs]

    def completion_logprobs(self, ids, lps, k, offset, as_id: bool) -> R.CompletionLogProbs | None:
        """The legacy completions shape of generated tokens' logprobs (None unless asked)."""
        if k is None or lps is None:
            return None
        out = R.CompletionLogProbs()
        for tid, lp in zip(ids, lps):
            offset = self._add_legacy(out, self.token_str(tid, as_id), clamp(lp[tid]), offset, {
                self.token_str(t, as_id): clamp(v) for t, v in sorted(lp.items(), key=lambda kv: -kv[1])[:k]})
        return out

    def echo_logprobs(self, out: RequestOutput, k: int, as_id: bool) -> R.CompletionLogProbs:
        """The prompt's tokens in the legacy completions shape (``echo`` with ``logprobs``): the first token has
        no logprob."""
        res, offset = R.CompletionLogProbs(), 0
        for tid, entry in zip(out.prompt_token_ids, out.prompt_logprobs or []):
            s = self.token_str(tid, as_id)
            if entry is None:
                offset = self._add_legacy(res, s, None, offset, None)
                continue
            top = sorted(entry.items(), key=lambda kv: kv[1].rank)[:k]
            offset = self._add_legacy(res, s, clamp(entry[tid].logprob), offset,
                                      {self.token_str(t, as_id): clamp(lp.logprob) for t, lp in top})
        return res

    @staticmethod
    def _add_legacy(res: R.CompletionLogProbs, s: str, lp: float | None, offset: int, top: dict | None) -> int:
        if top is not None:
            top.setdefault(s, lp)
        res.tokens.append(s)
        res.token_logprobs.append(lp)
        res.top_logprobs.append(top)
        res.text_offset.append(offset)
        return offset + len(s)

    def chat_logprobs(self, ids, lps, k, as_id: bool) -> R.ChatLogprobs | None:
        """Chat's shape of generated tokens' logprobs (None unless asked)."""
        if k is None or lps is None:
            return None

        def entry(cls, tid, v, **kw):
            s = self.token_str(tid, as_id)
            return cls(token=s, logprob=clamp(v), bytes=list(s.encode("utf-8")), **kw)

        return R.ChatLogprobs(content=[
            entry(R.TokenLogprob, tid, lp[tid], top_logprobs=[
                entry(R.TopLogprob, t, v) for t, v in sorted(lp.items(), key=lambda kv: -kv[1])[:k]])
            for tid, lp in zip(ids, lps)])

    def check_request(self, req: P.SamplingRequest) -> None:
        """400s that no SamplingParams check catches; then, with ``--enable-force-include-usage``, a stream reports
        its usage whatever it asked (in every chunk and in a last one, as vLLM)."""
        if req.stream_options is not None and not req.stream:
            raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options")
        if self.usage_options.force_include_usage and req.stream:
            req.stream_options = P.StreamOptions(include_usage=True, continuous_usage_stats=True)
