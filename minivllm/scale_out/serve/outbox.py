"""A replica's engine with its outputs batched per front: one Ray object per engine step, not one per token.

Each front holds one streaming ``outputs`` call to each replica it uses (its *channel*). ``ChannelLLM``
routes the outputs of the requests a front added into that front's :class:`Outbox`; the channel yields
everything the outbox gathered since its last item. At 200 running requests that is one object of 200 outputs
per step instead of 200 objects, which is what lets one front keep up with the replicas.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from minivllm.engine.async_engine import AsyncLLM
from minivllm.outputs import RequestOutput


@dataclass(frozen=True)
class RequestFailed:
    """In a channel batch: the request ended without a final output (its engine failed, or it was aborted here)."""

    request_id: str
    message: str


class Outbox:
    """The outputs waiting for one front's channel."""

    def __init__(self):
        self.items: list[RequestOutput | RequestFailed] = []
        self._ready = asyncio.Event()

    def put(self, item: RequestOutput | RequestFailed) -> None:
        self.items.append(item)
        self._ready.set()

    async def take(self) -> list[RequestOutput | RequestFailed]:
        """Everything gathered since the last call (waits for at least one item)."""
        await self._ready.wait()
        self._ready.clear()
        items, self.items = self.items, []
        return items


class ChannelLLM(AsyncLLM):
    """An ``AsyncLLM`` whose routed requests (``route``) send their outputs to their front's outbox, and resolve
    a future when they end (so the request's own call can return)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._front_of: dict[str, str] = {}  # request id -> front id
        self._ended: dict[str, asyncio.Future] = {}
        self.outboxes: dict[str, Outbox] = {}

    def route(self, request_id: str, front_id: str) -> asyncio.Future:
        """Send ``request_id``'s outputs to ``front_id``'s outbox; the future resolves when the request ends."""
        self._front_of[request_id] = front_id
        self.outboxes.setdefault(front_id, Outbox())
        fut = self._ended[request_id] = asyncio.get_running_loop().create_future()
        return fut

    def _end(self, request_id: str, failure: str | None = None) -> None:
        front = self._front_of.pop(request_id, None)
        if failure is not None and front in self.outboxes:
            self.outboxes[front].put(RequestFailed(request_id, failure))
        fut = self._ended.pop(request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        rest = []
        for out in outputs:
            front = self._front_of.get(out.request_id)
            if front is None:
                rest.append(out)
                continue
            self.outboxes[front].put(out)
            if out.finished:
                rs = self._streams.pop(out.request_id, None)
                if rs is not None:
                    rs.finished = True  # its outputs went to the outbox; nobody reads the stream itself
                self._end(out.request_id)
        if rest:
            super()._dispatch(rest)

    def abort(self, request_id: str) -> None:
        """Abort a request; its front gets a ``RequestFailed`` unless the front itself asked (it has forgotten it)."""
        super().abort(request_id)
        if request_id in self._front_of:
            self._end(request_id, "the request was aborted on its replica (it is shutting down)")

    def forget(self, request_id: str) -> None:
        """Abort a request its front gave up on (no ``RequestFailed``: the front is not waiting for it)."""
        self._front_of.pop(request_id, None)
        self.abort(request_id)
        self._end(request_id)

    def drop_front(self, front_id: str) -> None:
        """The front's channel closed: abort its requests and drop its outbox."""
        for rid in [r for r, f in self._front_of.items() if f == front_id]:
            self.forget(rid)
        self.outboxes.pop(front_id, None)

    def _on_failed(self, exc: BaseException) -> None:
        for rid in list(self._front_of):
            self._end(rid, f"the engine failed: {exc!r}")
        super()._on_failed(exc)
