"""The completion and chat-completion handlers: request → engine requests → OpenAI response or SSE stream."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from minivllm.engine.async_engine import AsyncLLM, RequestStream
from minivllm.entrypoints.openai import protocol as P
from minivllm.entrypoints.openai.errors import APIError
from minivllm.entrypoints.openai.inputs import RequestLimits, Tokenization
from minivllm.entrypoints.openai.streams import collect, delta_with_rest, guarded, sse, stream_outputs


def clamp(logprob: float) -> float:
    return max(logprob, -9999.0)  # -inf is not JSON


def json_response(obj) -> Response:
    return Response(obj.model_dump_json(), media_type="application/json")


class OpenAIServing:
    """Serves ``/v1/completions`` and ``/v1/chat/completions`` on an AsyncLLM (once its engine is ready)."""

    def __init__(self, llm: AsyncLLM, model_name: str, limits: RequestLimits = RequestLimits()):
        self.llm, self.model_name, self.limits = llm, model_name, limits
        self._tokenization: Tokenization | None = None

    @property
    def tokenization(self) -> Tokenization:
        """The engine's tokenizer, used off the event loop (made when the engine is ready)."""
        if self._tokenization is None:
            self.llm.check_usable()
            self._tokenization = Tokenization(self.llm.tokenizer, self.llm.max_model_len)
        return self._tokenization

    def check_model(self, model: str | None) -> None:
        """404 unless ``model`` is the served name (or omitted)."""
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")

    def token_str(self, token_id: int) -> str:
        return self.tokenization.decode_now([token_id], skip_special_tokens=False)

    async def prompt_ids(self, prompt: str | list[int], field: str = "prompt") -> list[int]:
        """A prompt as token ids: text is tokenized off the event loop; ids longer than the model's context are
        refused here, before the engine walks them."""
        if isinstance(prompt, str):
            return await self.tokenization.encode(prompt, field)
        if len(prompt) >= self.llm.max_model_len:
            raise APIError(400, f"the prompt has {len(prompt)} tokens, but max_model_len is "
                                f"{self.llm.max_model_len}: it must be shorter", param=field)
        return prompt

    async def _start(self, prompts: list, params, base_id: str) -> list[RequestStream]:
        streams: list[RequestStream] = []
        try:
            for i, prompt in enumerate(prompts):
                streams.append(await self.llm.add_request(prompt, params, f"{base_id}-{i}"))
        except BaseException:
            for s in streams:
                s.abort()
            raise
        return streams

    # ------------------------------------------------------------ completions
    async def completions(self, req: P.CompletionRequest, raw: Request):
        self.check_model(req.model)
        self.llm.check_usable()
        prompts = [req.prompt] if isinstance(req.prompt, str) or (req.prompt and isinstance(req.prompt[0], int)) \
            else list(req.prompt)
        if not prompts:
            raise APIError(400, "prompt must not be empty", param="prompt")
        self.limits.check(req, req.logprobs, "logprobs")
        if req.echo and req.logprobs is not None:
            raise APIError(400, "echo together with logprobs (prompt logprobs) is not supported", param="echo")
        params = req.to_sampling_params(req.max_tokens, req.logprobs)
        ids = [await self.prompt_ids(p) for p in prompts]
        rid = f"cmpl-{uuid.uuid4().hex}"
        echo = [(p if isinstance(p, str) else await self.tokenization.decode(p)) if req.echo else "" for p in prompts]
        streams = await self._start(ids, params, rid)
        if req.stream:
            return StreamingResponse(guarded(self._completion_stream(req, rid, streams, echo)),
                                     media_type="text/event-stream")
        finals = await collect(streams, raw)
        choices, usage = [], P.UsageInfo()
        for i, out in enumerate(finals):
            usage.prompt_tokens += len(out.prompt_token_ids)
            for c in out.outputs:
                usage.completion_tokens += len(c.token_ids)
                lp = self._completion_logprobs(c.token_ids, c.logprobs, req.logprobs, len(echo[i]))
                choices.append(P.CompletionChoice(index=i * params.n + c.index, text=echo[i] + c.text, logprobs=lp,
                                                  finish_reason=c.finish_reason, stop_reason=c.stop_reason))
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
        return json_response(P.CompletionResponse(id=rid, model=self.model_name, choices=choices, usage=usage))

    def _completion_logprobs(self, ids, lps, k, offset) -> P.CompletionLogProbs | None:
        if k is None or lps is None:
            return None
        out = P.CompletionLogProbs()
        for tid, lp in zip(ids, lps):
            s = self.token_str(tid)
            top = {self.token_str(t): clamp(v) for t, v in sorted(lp.items(), key=lambda kv: -kv[1])[:k]}
            top.setdefault(s, clamp(lp[tid]))
            out.tokens.append(s)
            out.token_logprobs.append(clamp(lp[tid]))
            out.top_logprobs.append(top)
            out.text_offset.append(offset)
            offset += len(s)
        return out

    async def _completion_stream(self, req, rid, streams, echo) -> AsyncIterator[str]:
        n = req.n
        sent: dict[int, int] = {}  # choice index -> completion characters streamed so far
        echoed: set[int] = set()
        usage = P.UsageInfo()

        def chunk(choices, usage=None):
            return sse(P.CompletionResponse(id=rid, model=self.model_name, choices=choices, usage=usage),
                       req.include_usage)

        async for i, c in stream_outputs(streams, usage):
            idx = i * n + c.index
            streamed = sent.get(idx, 0)
            text = delta_with_rest(c, streamed)
            lp = self._completion_logprobs(c.delta_token_ids, c.delta_logprobs, req.logprobs, len(echo[i]) + streamed)
            sent[idx] = streamed + len(text)
            if streamed == 0 and echo[i] and idx not in echoed:
                echoed.add(idx)
                text = echo[i] + text
            if text or c.finished or lp is not None or c.delta_token_ids:
                yield chunk([P.CompletionChoice(index=idx, text=text, logprobs=lp, finish_reason=c.finish_reason,
                                                stop_reason=c.stop_reason)])
        if req.include_usage:
            yield chunk([], usage)
        yield "data: [DONE]\n\n"

    # ------------------------------------------------------------------- chat
    async def chat(self, req: P.ChatCompletionRequest, raw: Request):
        self.check_model(req.model)
        self.llm.check_usable()
        k = (req.top_logprobs or 0) if req.logprobs else None
        self.limits.check(req, req.top_logprobs if req.top_logprobs is not None else k, "top_logprobs")
        ids = await self.tokenization.chat(req.messages, req.add_generation_prompt)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        if max_tokens is None:
            max_tokens = max(1, self.llm.max_model_len - len(ids))
        params = req.to_sampling_params(max_tokens, k)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        streams = await self._start([ids], params, rid)
        if req.stream:
            return StreamingResponse(guarded(self._chat_stream(req, rid, streams)), media_type="text/event-stream")
        (out,) = await collect(streams, raw)
        completion = sum(len(c.token_ids) for c in out.outputs)
        usage = P.UsageInfo(prompt_tokens=len(ids), completion_tokens=completion, total_tokens=len(ids) + completion)
        choices = [P.ChatChoice(index=c.index, message=P.AssistantMessage(content=c.text),
                                logprobs=self._chat_logprobs(c.token_ids, c.logprobs, k),
                                finish_reason=c.finish_reason, stop_reason=c.stop_reason) for c in out.outputs]
        return json_response(P.ChatCompletionResponse(id=rid, model=self.model_name, choices=choices, usage=usage))

    def _chat_logprobs(self, ids, lps, k) -> P.ChatLogprobs | None:
        if k is None or lps is None:
            return None

        def entry(cls, tid, v, **kw):
            s = self.token_str(tid)
            return cls(token=s, logprob=clamp(v), bytes=list(s.encode("utf-8")), **kw)

        return P.ChatLogprobs(content=[
            entry(P.TokenLogprob, tid, lp[tid], top_logprobs=[
                entry(P.TopLogprob, t, v) for t, v in sorted(lp.items(), key=lambda kv: -kv[1])[:k]])
            for tid, lp in zip(ids, lps)])

    async def _chat_stream(self, req, rid, streams) -> AsyncIterator[str]:
        sent: dict[int, int] = {}
        usage = P.UsageInfo()

        def chunk(choices, usage=None):
            return sse(P.ChatCompletionChunk(id=rid, model=self.model_name, choices=choices, usage=usage),
                       req.include_usage)

        for i in range(req.n):
            yield chunk([P.ChatChunkChoice(index=i, delta=P.DeltaMessage(role="assistant", content=""))])
        k = (req.top_logprobs or 0) if req.logprobs else None
        async for _, c in stream_outputs(streams, usage):
            text = delta_with_rest(c, sent.get(c.index, 0))
            sent[c.index] = sent.get(c.index, 0) + len(text)
            lp = self._chat_logprobs(c.delta_token_ids, c.delta_logprobs, k)
            if text or c.finished or lp is not None or c.delta_token_ids:
                delta = P.DeltaMessage(content=text if text or not c.finished else None)
                yield chunk([P.ChatChunkChoice(index=c.index, delta=delta, logprobs=lp, finish_reason=c.finish_reason)])
        if req.include_usage:
            yield chunk([], usage)
        yield "data: [DONE]\n\n"
