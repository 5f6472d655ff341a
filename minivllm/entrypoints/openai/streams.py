"""Request streams for HTTP: interleaving several, collecting them, and SSE framing.

Every helper aborts the requests it was given when it is left early (client gone, error,
cancellation), so their KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import Request

from minivllm.engine.protocol import OutputStream
from minivllm.entrypoints.openai import responses as R
from minivllm.entrypoints.openai.errors import error_response
from minivllm.outputs import CompletionOutput, RequestOutput


def sse(obj, include_usage: bool = True) -> str:
    """One server-sent event; ``usage`` is left out unless the client asked for it (then it is null in the
    chunks that carry none, as OpenAI sends them)."""
    return f"data: {obj.model_dump_json(exclude=None if include_usage else {'usage'})}\n\n"


def delta_with_rest(c: CompletionOutput, streamed: int) -> str:
    """This step's text; on the last step also whatever the detokenizer held back until the end."""
    if c.finished and len(c.text) > streamed + len(c.delta_text):
        return c.text[streamed:]
    return c.delta_text


async def merge(streams: list[OutputStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several request streams as ``(stream_index, output)``."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s: OutputStream) -> None:
        try:
            async for out in s:
                q.put_nowait((i, out))
        except Exception as exc:  # handed to the consumer, which raises it
            q.put_nowait((i, exc))
        finally:
            q.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            i, item = await q.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.abort()


async def collect(streams: list[OutputStream], raw: Request) -> list[RequestOutput]:
    """The final output of each stream; aborts them all if the client goes away first."""
    async def watch() -> None:
        while (await raw.receive())["type"] != "http.disconnect":
            pass
        for s in streams:
            s.abort()

    watcher = asyncio.create_task(watch())
    finals: list[RequestOutput | None] = [None] * len(streams)
    try:
        async for i, out in merge(streams):
            finals[i] = out
    finally:
        watcher.cancel()
        for s in streams:
            s.abort()
    return finals


async def stream_outputs(streams: list[OutputStream], usage: R.UsageInfo):
    """Yield ``(prompt_index, output, completion)`` for each completion still running, tallying the completion
    tokens into ``usage`` (whose ``prompt_tokens`` the caller sets), and once all ended the prefix-cache hits (in
    the last usage alone, as vLLM)."""
    done: set[tuple[int, int]] = set()
    seen: set[int] = set()
    cached = 0
    try:
        async for i, out in merge(streams):
            if i not in seen:
                seen.add(i)
                cached += out.num_cached_tokens
            for c in out.outputs:
                if (i, c.index) in done:
                    continue
                usage.completion_tokens += len(c.delta_token_ids)
                usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
                if c.finished:
                    done.add((i, c.index))
                yield i, out, c
        usage.set_cached_tokens(cached)
    finally:
        for s in streams:
            s.abort()


async def guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """SSE events; an error after the headers went out becomes an error event, then ``[DONE]``."""
    try:
        async for event in events:
            yield event
    except Exception as exc:
        yield f"data: {json.dumps(error_response(exc)[1])}\n\n"
        yield "data: [DONE]\n\n"
