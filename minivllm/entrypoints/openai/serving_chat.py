"""``POST /v1/chat/completions``: messages → the chat template → an engine request → a chat completion or an
SSE stream."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from minivllm.entrypoints.openai import protocol as P
from minivllm.entrypoints.openai import responses as R
from minivllm.entrypoints.openai.beam_search import check_beam_search_request
from minivllm.entrypoints.openai.chat_outputs import ChatOutputReader
from minivllm.entrypoints.openai.errors import APIError
from minivllm.entrypoints.openai.harmony_outputs import HarmonyOutputReader
from minivllm.entrypoints.openai.serving_base import ServingBase, final_usage, json_response, new_usage
from minivllm.entrypoints.openai.streams import collect, delta_with_rest, guarded, sse, stream_outputs
from minivllm.entrypoints.openai.structured import after_reasoning, constraint
from minivllm.sampling_params import ParameterError, truncate_prompt


class ChatServing(ServingBase):
    """The chat handler (OpenAI's fields, and vLLM's: ``echo``, ``continue_final_message``, ``chat_template``,
    ``chat_template_kwargs``, ``prompt_logprobs``, ``return_token_ids``, ``return_tokens_as_token_ids``)."""

    async def chat(self, req: P.ChatCompletionRequest, raw: Request):
        lora = self.check_model(req.model)
        self.check_request(req)
        self.llm.check_usable()
        k = (req.top_logprobs or 0) if req.logprobs else None
        self.limits.check(req, req.top_logprobs if req.top_logprobs is not None else k, "top_logprobs")
        if req.prompt_logprobs is not None:
            self.limits.check(req, req.prompt_logprobs, "prompt_logprobs")
        self.limits.check_template(req.chat_template)
        choice = req.effective_tool_choice
        if choice == "auto" and req.tools and self.parsers.tool_call_parser is None:
            raise APIError(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
                                'set', param="tool_choice")
        if not req.tools and choice not in ("none", "auto"):
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        harmony = self.parsers.harmony
        so, field = constraint(req.response_format, req.structured_outputs, req.tools, choice, req.parallel_tool_calls,
                               harmony=harmony)
        ids = await self.tokenization.chat(req.messages, req.template_args())
        if harmony:  # its channels and calls are read off special tokens, which the text must keep
            req.skip_special_tokens = False
            reader = HarmonyOutputReader(choice if req.tools else "none", self.parsers.reasoning_parser is not None,
                                         req.include_reasoning)
        else:
            tail = (self.tokenization.decode_now(ids[-8:], skip_special_tokens=False) if self.parsers.reasoning_parser
                    else "")
            reader = ChatOutputReader(choice if req.tools else "none", self.parsers.tool_call_parser,
                                      self.parsers.reasoning_parser, tail, req.include_reasoning)
        if so is not None and reader.reasoning_markers is not None:  # the model may reason first, as vLLM lets it
            start, end = [await self.tokenization.encode(m, add_special_tokens=False, check_length=False)
                          for m in reader.reasoning_markers]
            so = after_reasoning(so, reader.thinking, start, end)
        ids = truncate_prompt(ids, req.truncate_prompt_tokens, req.truncation_side or "left")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        if max_tokens is None:
            max_tokens = max(1, self.llm.model_info().max_model_len - len(ids))
        # echo with logprobs scores the prompt too, in the response's prompt_logprobs (vLLM's; not in a stream)
        prompt_k = k if req.echo and req.prompt_logprobs is None and not req.stream else None
        params = req.to_sampling_params(max_tokens, k, prompt_k, structured_outputs=so)
        if req.use_beam_search:
            check_beam_search_request(req, field, can_stream=True)
        await self.prepare_grammar(so, field)
        # echo repeats the last message when it is the assistant's (the role that is generated), as vLLM
        last = req.messages[-1]
        echo = last.to_template()["content"] if req.echo and last.role == "assistant" else ""
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if req.use_beam_search:  # a streamed response sends each choice whole, once the search ends (as vLLM)
            streams = self.start_beams([ids], req, max_tokens, rid,
                                       req.prompt_logprobs if req.prompt_logprobs is not None else prompt_k, lora)
        else:
            try:
                streams = await self.start([ids], params, rid, lora)
            except ParameterError as exc:
                if exc.parameter == "logprobs":  # the engine's name of what chat calls top_logprobs
                    exc.parameter = "top_logprobs"
                raise
        if req.stream:
            return StreamingResponse(guarded(self._chat_stream(req, rid, streams, ids, k, echo, reader)),
                                     media_type="text/event-stream")
        (out,) = await collect(streams, raw)
        as_id, with_ids = self.as_ids(req), req.return_token_ids
        choices = []
        for c in out.outputs:
            message = reader.message(c.text)
            if echo:
                message.content = echo + (message.content or "")
            choices.append(R.ChatChoice(
                index=c.index, message=message,
                logprobs=self.chat_logprobs(c.token_ids, c.logprobs, k, as_id, bool(req.logprob_token_ids)),
                finish_reason=_finish_reason(c.finish_reason, bool(message.tool_calls)), stop_reason=c.stop_reason,
                token_ids=list(c.token_ids) if with_ids else None))
        usage = final_usage([out], self.usage_options)
        self._count_reasoning(usage, reader, [c.token_ids for c in out.outputs])
        return json_response(R.ChatCompletionResponse(
            id=rid, model=self.response_model(req), choices=choices, usage=usage,
            prompt_logprobs=self.prompt_logprobs(out) if params.prompt_logprobs is not None else None,
            prompt_token_ids=list(out.prompt_token_ids) if with_ids else None,
            metrics=self.metrics_of([out], req.n, usage.completion_tokens)))

    def _count_reasoning(self, usage: R.UsageInfo, reader: ChatOutputReader | HarmonyOutputReader, outputs: list[list[int]]) -> None:
        """``usage.completion_tokens_details.reasoning_tokens``, where the server has a reasoning parser (vLLM's)."""
        if self.parsers.reasoning_parser is None:
            return
        decode = self.tokenization.decode_now_with_special
        usage.completion_tokens_details = R.CompletionTokensDetails(
            reasoning_tokens=sum(reader.reasoning_tokens(list(ids), decode) for ids in outputs))

    async def _chat_stream(self, req, rid, streams, ids, k, echo, reader) -> AsyncIterator[str]:
        sent: dict[int, int] = {}
        generated: dict[int, list[int]] = {}  # each choice's token ids, for the reasoning tokens of the usage
        streamers = [reader.streamer() for _ in range(req.n)]
        usage = new_usage(len(ids), self.usage_options)

        def chunk(choice, **extra):
            return sse(R.ChatCompletionChunk(id=rid, model=self.response_model(req), choices=[choice],
                                             usage=usage.model_copy(deep=True) if req.continuous_usage else None,
                                             **extra), req.include_usage)

        first_ids = {"prompt_token_ids": list(ids)} if req.return_token_ids else {}
        for i in range(req.n):
            yield chunk(R.ChatChunkChoice(index=i, delta=R.DeltaMessage(role="assistant", content="")),
                        **(first_ids if i == 0 else {}))
            if echo:
                yield chunk(R.ChatChunkChoice(index=i, delta=R.DeltaMessage(content=echo)))
        latest = None
        async for _, out, c in stream_outputs(streams, usage):
            latest = out
            text = delta_with_rest(c, sent.get(c.index, 0))
            sent[c.index] = sent.get(c.index, 0) + len(text)
            lp = self.chat_logprobs(c.delta_token_ids, c.delta_logprobs, k, self.as_ids(req),
                                    bool(req.logprob_token_ids))
            st = streamers[c.index]
            generated.setdefault(c.index, []).extend(c.delta_token_ids)
            ids_now = list(c.delta_token_ids) if req.return_token_ids else None
            delta = st.feed(text) if text else None
            if c.finished:
                last = st.finish()
                if delta is not None and last is not None:  # two chunks, so no call index repeats in one
                    yield chunk(R.ChatChunkChoice(index=c.index, delta=delta, logprobs=lp, token_ids=ids_now))
                    delta, lp, ids_now = last, None, [] if ids_now is not None else None
                else:
                    delta = delta or last
            if delta is not None or c.finished or lp is not None or c.delta_token_ids:
                yield chunk(R.ChatChunkChoice(
                    index=c.index, delta=delta or R.DeltaMessage(), logprobs=lp,
                    finish_reason=_finish_reason(c.finish_reason, st.num_calls > 0), stop_reason=c.stop_reason,
                    token_ids=ids_now))
        if req.include_usage:
            self._count_reasoning(usage, reader, list(generated.values()))
            yield sse(R.ChatCompletionChunk(id=rid, model=self.response_model(req), choices=[], usage=usage,
                                            metrics=self.metrics_of([latest], req.n, usage.completion_tokens)))
        yield "data: [DONE]\n\n"


def _finish_reason(reason: str | None, called_tools: bool) -> str | None:
    """``tool_calls`` for a choice that ended by calling tools, as OpenAI reports it."""
    return "tool_calls" if called_tools and reason == "stop" else reason

