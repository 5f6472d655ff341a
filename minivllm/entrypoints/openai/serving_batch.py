"""``POST /v1/chat/completions/batch`` (vLLM's): several conversations in one request, one choice each.

Each conversation is a chat completion of its own, run by the chat handler, all at once (the engine batches them);
the response is one ``chat.completion`` whose choice ``i`` answers conversation ``i`` and whose usage adds theirs
up. If one conversation is refused (a 400, a 429), the others are aborted and the request gets that error.
"""

from __future__ import annotations

import asyncio
import uuid

from fastapi import Request

from minivllm.entrypoints.openai import protocol as P
from minivllm.entrypoints.openai import responses as R
from minivllm.entrypoints.openai.errors import APIError
from minivllm.entrypoints.openai.serving import OpenAIServing
from minivllm.entrypoints.openai.serving_base import json_response


def check_batch(req: P.BatchChatCompletionRequest) -> None:
    """400s for what a batch cannot do (vLLM's limits), naming the field."""
    if req.stream:
        raise APIError(400, "Batch chat completions do not support streaming. Please set `stream` to false.",
                       param="stream")
    if req.n != 1:
        raise APIError(400, "Batch chat completions do not support `n > 1`. Please set `n` to 1.", param="n")
    if req.tools or req.tool_choice not in (None, "none"):
        raise APIError(400, "Batch chat completions do not support tools.", param="tools" if req.tools else "tool_choice")
    empty = next((i for i, conversation in enumerate(req.messages) if not conversation), None)
    if empty is not None:
        raise APIError(400, f"messages.{empty}: a conversation needs at least one message", param="messages")


class BatchChatServing:
    """Serves ``/v1/chat/completions/batch`` with the chat handler of ``serving``."""

    def __init__(self, serving: OpenAIServing):
        self.serving = serving

    async def chat_batch(self, req: P.BatchChatCompletionRequest, raw: Request):
        self.serving.check_model(req.model)
        check_batch(req)
        tasks = [asyncio.ensure_future(self.serving.chat(req.conversation(i), raw)) for i in range(len(req.messages))]
        try:
            answers: list[R.ChatCompletionResponse] = [r.payload for r in await asyncio.gather(*tasks)]
        except BaseException:  # the first to fail cancels the others, which abort their requests
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        usage = R.UsageInfo()
        cached = 0
        choices = []
        for i, answer in enumerate(answers):
            (choice,) = answer.choices
            choices.append(choice.model_copy(update={"index": i}))
            usage.prompt_tokens += answer.usage.prompt_tokens
            usage.completion_tokens += answer.usage.completion_tokens
            if answer.usage.prompt_tokens_details is not None:
                cached += answer.usage.prompt_tokens_details.cached_tokens
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
        if any(a.usage.prompt_tokens_details is not None for a in answers):  # --enable-prompt-tokens-details
            usage.prompt_tokens_details = R.PromptTokensDetails(cached_tokens=cached)
        return json_response(R.ChatCompletionResponse(id=f"chatcmpl-{uuid.uuid4().hex}", model=self.serving.response_model(req),
                                                      choices=choices, usage=usage))
