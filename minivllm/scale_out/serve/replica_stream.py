"""One request's outputs on the OpenAI front, from whichever replica runs it (``ReplicaStream``).

Its ``generate`` call to the replica says when the replica accepted the request (and which replica it is), stays
open while the request runs, and is cancelled to abort it; the outputs arrive through the front's channel to that
replica (``ReplicaEngineClient._deliver``). A replica that dies before the request yielded anything gets the
request once more, on another replica; after that, the stream ends with :class:`ReplicaDiedError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from minivllm.engine.protocol import EngineDeadError
from minivllm.outputs import RequestOutput
from minivllm.scale_out.serve.replica import ReplicaRequest

_FINAL_GRACE_S = 5.0  # how long a final output may trail its request's call (they travel on different streams)


class ReplicaDiedError(EngineDeadError):
    """The replica running a request died after the request had started streaming."""


def _replica_died(exc: BaseException) -> bool:
    from ray.exceptions import ActorUnavailableError, RayActorError

    return isinstance(exc, (RayActorError, ActorUnavailableError))


def unwrap(exc: BaseException) -> BaseException:
    """The replica's own exception (a ValueError naming the field) rather than Ray's wrapper."""
    from ray.exceptions import RayTaskError

    if isinstance(exc, RayTaskError) and isinstance(exc.cause, BaseException):
        return exc.cause
    return exc


class ReplicaStream:
    """One request's outputs, as ``RequestStream``: async iteration, ``abort()``, ``finished``."""

    def __init__(self, client, request: ReplicaRequest, retries: int = 1):
        self.request_id, self.params, self.finished = request.request_id, request.params, False
        self.request, self.replica = request, None
        self._client, self._retries = client, retries
        self._call = None
        self._watch: asyncio.Task | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._yielded = False
        self._lost: set[str] = set()

    async def open(self) -> None:
        """Send the request; returns once a replica accepted it (raises its ValueError, or a 429's error)."""
        while True:
            self._call = self._client.engines.options(stream=True).generate.remote(self.request,
                                                                                   self._client.front_id)
            try:
                self.replica = await self._next()  # the replica's id: it accepted the request
                break
            except BaseException as exc:
                if not self._retry(exc):
                    self.finished = True
                    if _replica_died(exc):
                        raise self._died(exc) from exc
                    raise
        self._client.ensure_channel(self.replica)
        self._watch = asyncio.create_task(self._watch_call())

    async def _next(self):
        try:
            return await self._call.__anext__()
        except StopAsyncIteration:
            raise
        except BaseException as exc:
            raise unwrap(exc) from None

    async def _watch_call(self) -> None:
        """Wait for the request's call to end; if the request has not finished by then, fail or retry it."""
        try:
            while True:
                await self._next()
        except StopAsyncIteration:
            await asyncio.sleep(_FINAL_GRACE_S)  # the final output may still be on the channel
            if not self.finished:
                self.on_lost(ReplicaDiedError(f"request {self.request_id}: its replica ended it without a result"))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if not self.finished:
                self.on_lost(exc)

    def on_lost(self, exc: BaseException, replica: str | None = None) -> None:
        """The request's replica died (or lost it): retried if nothing streamed yet, else the stream fails. Both
        the request's call and the replica's channel report it: the first report counts."""
        replica = replica or self.replica
        if self.finished or replica != self.replica or replica in self._lost:
            return
        self._lost.add(replica)
        if self._retry(exc):
            asyncio.create_task(self._reopen())
        else:
            self._queue.put_nowait(self._died(exc) if _replica_died(exc) else exc)

    async def _reopen(self) -> None:
        try:
            await self.open()
        except BaseException as exc:
            self._queue.put_nowait(exc)

    def _died(self, exc: BaseException) -> ReplicaDiedError:
        return ReplicaDiedError(f"request {self.request_id}: its replica died ({type(exc).__name__}); the other "
                                f"replicas keep serving, retry it")

    def _retry(self, exc: BaseException) -> bool:
        if not _replica_died(exc) or self._yielded or self._retries < 1:
            return False
        self._retries -= 1
        self._client.on_retry()
        return True

    def deliver(self, item: RequestOutput | BaseException) -> None:
        """An output from the channel (or why the request failed)."""
        self._queue.put_nowait(item)

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                self._yielded = True
                self.finished = item.finished
                yield item
        finally:
            self.abort()

    def abort(self) -> None:
        """Cancel the request's call (the replica aborts it and frees its KV blocks) unless it finished."""
        was_running, self.finished = not self.finished, True
        self._client.forget(self.request_id)
        if self._watch is not None:
            self._watch.cancel()
        if was_running and self._call is not None:
            self._call.cancel()
