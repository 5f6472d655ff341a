"""``POST /v1/completions``: prompts (texts or token ids) → engine requests → a completion or an SSE stream."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from minivllm.entrypoints.openai import protocol as P
from minivllm.entrypoints.openai import responses as R
from minivllm.entrypoints.openai.beam_search import check_beam_search_request
from minivllm.entrypoints.openai.errors import APIError
from minivllm.entrypoints.openai.serving_base import ServingBase, final_usage, json_response, new_usage
from minivllm.entrypoints.openai.streams import collect, delta_with_rest, guarded, sse, stream_outputs
from minivllm.entrypoints.openai.structured import constraint


class CompletionServing(ServingBase):
    """The completions handler (OpenAI's fields, and vLLM's: ``echo`` with ``logprobs`` gives the prompt's
    logprobs too, ``prompt_logprobs``, ``return_token_ids``, ``return_tokens_as_token_ids``)."""

    async def completions(self, req: P.CompletionRequest, raw: Request):
        lora = self.check_model(req.model)
        self.check_request(req)
        self.llm.check_usable()
        if not req.prompt:  # vLLM's words, which clients match on
            raise APIError(400, "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
        prompts = [req.prompt] if isinstance(req.prompt, str) or isinstance(req.prompt[0], int) else list(req.prompt)
        if any(len(p) == 0 for p in prompts):
            raise APIError(400, "The decoder prompt cannot be empty", param="prompt")
        self.limits.check(req, req.logprobs, "logprobs")
        # echo with logprobs scores the prompt too: prompt logprobs with the same number of alternatives
        prompt_k = req.prompt_logprobs
        if req.echo and req.logprobs is not None:
            prompt_k = -1 if -1 in (req.logprobs, prompt_k) else max(req.logprobs, prompt_k or 0)  # -1: all
        if prompt_k is not None:
            self.limits.check(req, prompt_k, "prompt_logprobs")
        so, field = constraint(req.response_format, req.structured_outputs)
        params = req.to_sampling_params(req.max_tokens, req.logprobs, prompt_k, so)
        if req.use_beam_search:
            check_beam_search_request(req, field, can_stream=False)
        await self.prepare_grammar(so, field)
        side = params.truncation_side or "left"
        ids = [await self.prompt_ids(p, req.truncate_prompt_tokens, side=side) for p in prompts]
        rid = f"cmpl-{uuid.uuid4().hex}"
        echo = [await self._echo(req, p, q) for p, q in zip(prompts, ids)]
        if req.use_beam_search:  # one search per prompt, started as the response reads it
            streams = self.start_beams(ids, req, req.max_tokens, rid, prompt_k, lora)
        else:
            streams = await self.start(ids, params, rid, lora)
        if req.stream:
            return StreamingResponse(guarded(self._completion_stream(req, rid, streams, ids, echo)),
                                     media_type="text/event-stream")
        finals = await collect(streams, raw)
        choices = []
        for i, out in enumerate(finals):
            prompt_lps = self.prompt_logprobs(out) if req.prompt_logprobs is not None else None
            for c in out.outputs:
                lp = self.completion_logprobs(c.token_ids, c.logprobs, req.logprobs, len(echo[i]), self.as_ids(req))
                if lp is not None and req.echo:
                    lp = self._join(self.echo_logprobs(out, req.logprobs, self.as_ids(req)), lp)
                choices.append(R.CompletionChoice(
                    index=i * params.n + c.index, text=echo[i] + c.text, logprobs=lp, finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason, prompt_logprobs=prompt_lps,
                    prompt_token_ids=list(out.prompt_token_ids) if req.return_token_ids else None,
                    token_ids=list(c.token_ids) if req.return_token_ids else None))
        usage = final_usage(finals, self.usage_options)
        return json_response(R.CompletionResponse(id=rid, model=self.response_model(req), choices=choices, usage=usage,
                                                  metrics=self.metrics_of(finals, req.n, usage.completion_tokens)))

    async def _echo(self, req: P.CompletionRequest, prompt: str | list[int], ids: list[int]) -> str:
        """What ``echo`` repeats of a prompt, as vLLM: a text as sent; token ids (or a cut text) decoded with their
        special tokens."""
        if not req.echo:
            return ""
        if isinstance(prompt, str) and req.truncate_prompt_tokens is None:
            return prompt
        return await self.tokenization.decode(ids, skip_special_tokens=False)

    @staticmethod
    def _join(prompt: R.CompletionLogProbs, gen: R.CompletionLogProbs) -> R.CompletionLogProbs:
        """The prompt's legacy logprobs followed by the completion's (whose offsets already count the echo)."""
        return R.CompletionLogProbs(text_offset=prompt.text_offset + gen.text_offset, tokens=prompt.tokens + gen.tokens,
                                    token_logprobs=prompt.token_logprobs + gen.token_logprobs,
                                    top_logprobs=prompt.top_logprobs + gen.top_logprobs)

    async def _completion_stream(self, req, rid, streams, ids, echo) -> AsyncIterator[str]:
        n, as_id = req.n, self.as_ids(req)
        sent: dict[int, int] = {}  # choice index -> completion characters streamed so far
        usage = new_usage(sum(len(p) for p in ids), self.usage_options)

        def chunk(choice):
            return sse(R.CompletionResponse(id=rid, model=self.response_model(req), choices=[choice],
                                            usage=usage.model_copy(deep=True) if req.continuous_usage else None),
                       req.include_usage)

        out = None
        async for i, out, c in stream_outputs(streams, usage):
            idx = i * n + c.index
            first = idx not in sent
            streamed = sent.get(idx, 0)
            text = delta_with_rest(c, streamed)
            lp = self.completion_logprobs(c.delta_token_ids, c.delta_logprobs, req.logprobs,
                                          len(echo[i]) + streamed, as_id)
            sent[idx] = streamed + len(text)
            extra = {}
            if first:
                text = echo[i] + text
                if lp is not None and req.echo:
                    lp = self._join(self.echo_logprobs(out, req.logprobs, as_id), lp)
                if req.prompt_logprobs is not None:
                    extra["prompt_logprobs"] = self.prompt_logprobs(out)
                if req.return_token_ids:
                    extra["prompt_token_ids"] = list(out.prompt_token_ids)
            if text or c.finished or lp is not None or c.delta_token_ids or first:
                yield chunk(R.CompletionChoice(
                    index=idx, text=text, logprobs=lp, finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                    token_ids=list(c.delta_token_ids) if req.return_token_ids else None, **extra))
        if req.include_usage:
            yield sse(R.CompletionResponse(id=rid, model=self.response_model(req), choices=[], usage=usage,
                                           metrics=self.metrics_of([out] * len(ids), n, usage.completion_tokens)))
        yield "data: [DONE]\n\n"
