"""What the completion and chat handlers share: the served model, the tokenizer off the event loop, prompts
as token ids, starting engine requests, usage, and logprobs in OpenAI's and vLLM's shapes. The engine is an
``EngineClient`` (``engine/protocol.py``): one engine in this process, or the Ray Serve front's replicas."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from fastapi.responses import Response

from minivllm.engine.beam_search import BeamSearchStream
from minivllm.engine.protocol import EngineClient, OutputStream
from minivllm.entrypoints.openai import protocol as P
from minivllm.entrypoints.openai import responses as R
from minivllm.entrypoints.openai.beam_search import beam_search_params
from minivllm.entrypoints.openai.errors import APIError
from minivllm.entrypoints.openai.inputs import RequestLimits, Tokenization
from minivllm.entrypoints.openai.request_metrics import request_metrics
from minivllm.entrypoints.openai.serving_models import ServedModels
from minivllm.lora.request import LoRARequest
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import truncate_prompt
from minivllm.structured_outputs_params import StructuredOutputsParams


def clamp(logprob: float) -> float:
    return max(logprob, -9999.0)  # -inf is not JSON


def first(k: int) -> int | None:
    """The slice end of ``k`` alternatives: -1 asks for all of them."""
    return None if k == -1 else k


def _generated_first(token_id: int, logprobs: dict[int, float]) -> list[tuple[int, float]]:
    """A position's ``(token, logprob)`` candidates with the generated token first, then by descending logprob
    (ties: the lower id first), as vLLM's engine orders them."""
    rest = sorted((kv for kv in logprobs.items() if kv[0] != token_id), key=lambda kv: (-kv[1], kv[0]))
    return ([(token_id, logprobs[token_id])] if token_id in logprobs else []) + rest


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
    """How chat outputs are read back: ``tool_call_parser`` (set when ``tool_choice: auto`` is enabled),
    ``reasoning_parser`` (None: off), and ``harmony``: as gpt-oss's harmony messages (``harmony_outputs.py``;
    set by the harmony parsers' names)."""

    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    harmony: bool = False


class ServingBase:
    """Serves requests on an engine client (once its engine is ready) under one model name."""

    def __init__(self, llm: EngineClient, model_name: str, limits: RequestLimits = RequestLimits(),
                 parsers: ChatParsers = ChatParsers(), usage_options: UsageOptions = UsageOptions(),
                 tokens_as_ids: bool = False, per_request_metrics: bool = False, models: ServedModels | None = None):
        """``tokens_as_ids``: the server's default of ``return_tokens_as_token_ids``; ``per_request_metrics``: add
        each request's timings to its response (``--enable-per-request-metrics``); ``models``: the names served
        (default: ``model_name`` alone, no adapter)."""
        self.llm, self.model_name, self.limits, self.parsers = llm, model_name, limits, parsers
        self.models = models or ServedModels(llm, model_name)
        self.usage_options = usage_options
        self.tokens_as_ids = tokens_as_ids
        self.per_request_metrics = per_request_metrics
        self._tokenization: Tokenization | None = None

    @property
    def tokenization(self) -> Tokenization:
        """The engine's tokenizer, used off the event loop (made when the engine is ready)."""
        if self._tokenization is None:
            self.llm.check_usable()
            self._tokenization = Tokenization(self.llm.tokenizer, self.llm.model_info().max_model_len)
        return self._tokenization

    def metrics_of(self, finals: list[RequestOutput | None], n: int, num_generated: int):
        """A response's ``metrics`` (``--enable-per-request-metrics``): the timings of its one request of one
        completion, which generated ``num_generated`` tokens; None otherwise (as vLLM: the timestamps of several
        prompts or completions are no one's)."""
        if not self.per_request_metrics or len(finals) != 1 or n != 1:
            return None
        return request_metrics(finals[0], num_generated)

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter that ``model`` names (None: the base model, or omitted); a 404 for a name not served."""
        return self.models.lora_request_of(model)

    def response_model(self, req) -> str:
        """The ``model`` a response names: the request's (the base model or an adapter, checked), else the base."""
        return req.model or self.model_name

    def as_ids(self, req: P.SamplingRequest) -> bool:
        """Whether ``req``'s logprobs name tokens ``"token_id:N"``: its ``return_tokens_as_token_ids``, else the
        server's default; always without a tokenizer (``--skip-tokenizer-init``: tokens have no text)."""
        if self.tokenization.tokenizer is None:
            return True
        return self.tokens_as_ids if req.return_tokens_as_token_ids is None else req.return_tokens_as_token_ids

    def token_str(self, token_id: int, as_id: bool = False) -> str:
        """A token's text, or ``"token_id:N"`` (``return_tokens_as_token_ids``)."""
        return f"token_id:{token_id}" if as_id else self.tokenization.decode_now([token_id], skip_special_tokens=False)

    async def prompt_ids(self, prompt: str | list[int], truncate: int | None = None, field: str = "prompt",
                         side: str = "left") -> list[int]:
        """A prompt as token ids (``truncate`` of them, cut on ``side``: left keeps the last): text is tokenized off
        the event loop; ids longer than the model's context are refused here, before the engine walks them."""
        if isinstance(prompt, str):
            prompt = await self.tokenization.encode(prompt, field, check_length=truncate is None)
        prompt = truncate_prompt(prompt, truncate, side)
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

    async def start(self, prompts: list, params, base_id: str,
                    lora_request: LoRARequest | None = None) -> list[OutputStream]:
        """One engine request per prompt (``{base_id}-{i}``), with the adapter ``lora_request`` (None: the base
        model); all aborted if one cannot start."""
        streams: list[OutputStream] = []
        try:
            for i, prompt in enumerate(prompts):
                streams.append(await self.llm.add_request(prompt, params, f"{base_id}-{i}", lora_request=lora_request))
        except BaseException:
            for s in streams:
                s.abort()
            raise
        return streams

    def start_beams(self, prompts: list[list[int]], req: P.SamplingRequest, max_tokens: int | None, base_id: str,
                    prompt_logprobs: int | None = None, lora_request: LoRARequest | None = None) -> list[OutputStream]:
        """One beam search per prompt (``{base_id}-{i}``, ``use_beam_search``), each an output stream whose one
        output has the ``n`` best beams as its completions; ``max_tokens`` None: up to ``max_model_len``. A 400 for
        a prompt that cannot take ``max_tokens`` more tokens, and for parameters out of range. The searches start
        when their streams are read."""
        info = self.llm.model_info()
        decode = partial(self.tokenization.decode_now, skip_special_tokens=req.skip_special_tokens)
        streams: list[OutputStream] = []
        for i, ids in enumerate(prompts):
            steps = max_tokens if max_tokens is not None else info.max_model_len - len(ids)
            if len(ids) + steps > info.max_model_len:
                raise APIError(400, f"This model's maximum context length is {info.max_model_len} tokens. However, "
                                    f"you requested {len(ids) + steps} tokens ({len(ids)} in the prompt, {steps} in "
                                    f"the completion). Please reduce the length of the prompt or the completion.")
            streams.append(BeamSearchStream(
                self.llm, ids, beam_search_params(req, steps, info.max_logprobs), f"{base_id}-{i}", num_outputs=req.n,
                eos_token_ids=info.eos_token_ids, max_model_len=info.max_model_len, decode=decode, seed=req.seed,
                prompt_logprobs=prompt_logprobs, lora_request=lora_request))
        return streams

    def prompt_logprobs(self, out: RequestOutput) -> R.PromptLogprobs | None:
        """vLLM's ``prompt_logprobs``: per prompt token ``{"id": {logprob, rank, decoded_token}}``, None first."""
        if out.prompt_logprobs is None:
            return None
        return [None if entry is None else {
            str(tid): R.PromptLogprob(logprob=clamp(lp.logprob), rank=lp.rank, decoded_token=self.token_str(tid))
            for tid, lp in entry.items()} for entry in out.prompt_logprobs]

    def completion_logprobs(self, ids, lps, k, offset, as_id: bool) -> R.CompletionLogProbs | None:
        """The legacy completions shape of generated tokens' logprobs (None unless asked): each token's top
        logprobs are what the engine gave, in its order (as vLLM): the token first, then its ``k`` most likely
        alternatives or its ``logprob_token_ids``."""
        if k is None or lps is None:
            return None
        out = R.CompletionLogProbs()
        for tid, lp in zip(ids, lps):
            offset = self._add_legacy(out, self.token_str(tid, as_id), clamp(lp[tid]), offset,
                                      {self.token_str(t, as_id): clamp(v) for t, v in lp.items()})
        return out

    def echo_logprobs(self, out: RequestOutput, k: int, as_id: bool) -> R.CompletionLogProbs:
        """The prompt's tokens in the legacy completions shape (``echo`` with ``logprobs``): the first token has
        no logprob; each other's top logprobs are it, then its ``k`` most likely alternatives (vLLM's order)."""
        res, offset = R.CompletionLogProbs(), 0
        for tid, entry in zip(out.prompt_token_ids, out.prompt_logprobs or []):
            s = self.token_str(tid, as_id)
            if entry is None:
                offset = self._add_legacy(res, s, None, offset, None)
                continue
            others = sorted(((t, lp) for t, lp in entry.items() if t != tid), key=lambda kv: kv[1].rank)
            top = {s: clamp(entry[tid].logprob)}
            top.update((self.token_str(t, as_id), clamp(lp.logprob)) for t, lp in others[:first(k)])
            offset = self._add_legacy(res, s, top[s], offset, top)
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

    def chat_logprobs(self, ids, lps, k, as_id: bool, chosen: bool = False) -> R.ChatLogprobs | None:
        """Chat's shape of generated tokens' logprobs (None unless asked): ``k`` alternatives in vLLM 0.33's order,
        the generated token first, then the most likely of the others (so a generated token outside the top
        ``k`` leaves out the k-th); with ``chosen`` (``logprob_token_ids``) the token and those ids, in that order."""
        if k is None or lps is None:
            return None

        def entry(cls, tid, v, text: str | None = None, **kw):
            s = self.token_str(tid, as_id)
            return cls(token=s, logprob=clamp(v), bytes=list((s if text is None else text).encode("utf-8")), **kw)

        # a generated token's bytes are its text's, even as "token_id:N"; an alternative's, its token's (vLLM's)
        return R.ChatLogprobs(content=[
            entry(R.TokenLogprob, tid, lp[tid], text=self.token_str(tid), top_logprobs=[
                entry(R.TopLogprob, t, v) for t, v in (lp.items() if chosen else _generated_first(tid, lp)[:first(k)])])
            for tid, lp in zip(ids, lps)])

    def check_request(self, req: P.SamplingRequest) -> None:
        """400s that no SamplingParams check catches (vLLM's words where it has them); then, with
        ``--enable-force-include-usage``, a stream reports its usage whatever it asked (in every chunk and in a last
        one, as vLLM)."""
        if req.stream_options is not None and not req.stream:
            raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options")
        if req.logprob_token_ids is not None:
            if not req.logprob_token_ids:
                raise APIError(400, "`logprob_token_ids` must not be an empty list.", param="logprob_token_ids")
            if isinstance(req, P.ChatCompletionRequest) and not req.logprobs:
                raise APIError(400, "when using `logprob_token_ids`, `logprobs` must be set to true.",
                               param="logprob_token_ids")
            if isinstance(req, P.CompletionRequest) and req.logprobs is None:
                raise APIError(400, "when using `logprob_token_ids`, `logprobs` must be set.",
                               param="logprob_token_ids")
        if self.usage_options.force_include_usage and req.stream:
            req.stream_options = P.StreamOptions(include_usage=True, continuous_usage_stats=True)
