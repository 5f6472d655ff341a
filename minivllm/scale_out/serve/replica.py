"""One engine replica of the Ray Serve deployment: an engine behind ``generate`` and an ``outputs`` channel.

The OpenAI front (``front.py``) parses and tokenizes each request, and calls ``generate`` through a deployment
handle; the router (``router.py``) picks the replica. ``generate`` yields the replica's id once the engine took
the request (so bad parameters and a full queue fail the call before anything streams), then stays open until
the request ends: Serve counts it as one request in flight (least-loaded routing, autoscaling), and the front
cancels it to abort the request. The outputs themselves travel on the front's channel (``outputs``, one per
front and replica), batched per engine step (``outbox.py``). Every ``metrics_interval_s`` the replica posts its
Prometheus metrics to the :class:`~minivllm.scale_out.serve.metrics.MetricsBoard`, under its replica id.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from minivllm.engine.protocol import EngineDeadError, ModelInfo
from minivllm.entrypoints.openai.metrics import PrometheusStatLogger
from minivllm.lora.request import LoRARequest
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.scale_out.serve.outbox import ChannelLLM, Outbox, RequestFailed


@dataclass(frozen=True)
class ReplicaRequest:
    """One engine request as the front sends it to a replica (the router reads ``prompt`` for prefix affinity)."""

    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    lora_request: LoRARequest | None = None


@dataclass(frozen=True)
class Channel:
    """The ``outputs`` call of one front to one replica (the router sends it to exactly that replica)."""

    replica_id: str
    front_id: str


class EngineReplica:
    """An engine (with its tensor-parallel workers) serving ``generate`` streams; Serve runs one per replica."""

    async def __init__(self, model: str, engine_kwargs: dict, served_model_name: str,
                       max_num_waiting: int | None, board=None, metrics_interval_s: float = 1.0):
        from ray import serve

        self._poster: asyncio.Task | None = None
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.stats = PrometheusStatLogger(served_model_name)
        self.llm = ChannelLLM.from_model(model, stat_loggers=[self.stats], max_num_waiting=max_num_waiting,
                                       **engine_kwargs)
        self.llm.start()
        await self.llm.wait_ready()  # Serve routes to a replica once its constructor returned
        self._board, self._interval = board, metrics_interval_s
        self._poster = asyncio.create_task(self._post_metrics()) if board is not None else None

    async def generate(self, request: ReplicaRequest, front_id: str) -> AsyncIterator[str]:
        """This replica's id once the engine took the request; returns when the request ends (its outputs go
        to the front's channel). Cancelling the call aborts the request."""
        rid = request.request_id
        ended = self.llm.route(rid, front_id)
        try:
            await self.llm.add_request(request.prompt, request.params, rid, request.lora_request)
        except BaseException:
            self.llm.forget(rid)
            raise
        yield self.replica_id
        try:
            await ended
        finally:
            if not ended.done():  # the front cancelled the call
                self.llm.forget(rid)

    async def outputs(self, channel: Channel) -> AsyncIterator[list[RequestOutput | RequestFailed]]:
        """The channel of one front: ``[]`` at once, then every batch of its requests' outputs. When the front
        goes away, its requests here are aborted."""
        if channel.replica_id != self.replica_id:
            raise ValueError(f"channel for replica {channel.replica_id} reached replica {self.replica_id}")
        box = self.llm.outboxes.setdefault(channel.front_id, Outbox())
        yield []
        try:
            while True:
                yield await box.take()
        finally:
            self.llm.drop_front(channel.front_id)

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Check a LoRA adapter's folder with this replica's engine, and make it known there."""
        return await self.llm.add_lora(lora_request)

    async def remove_lora(self, lora_int_id: int) -> bool:
        """Forget a LoRA adapter on this replica."""
        return await self.llm.remove_lora(lora_int_id)

    def model_info(self) -> ModelInfo:
        """The served model's lengths, special tokens and KV cache."""
        return self.llm.model_info()

    def metrics(self) -> tuple[str, bytes]:
        """``(replica id, this replica's metrics in the Prometheus text format)``."""
        return self.replica_id, self.stats.render()

    def check_health(self) -> None:
        """Serve's health check: a replica whose engine failed is replaced."""
        if self.llm.error is not None:
            raise EngineDeadError(f"the engine failed: {self.llm.error!r}")

    async def _post_metrics(self) -> None:
        while True:
            try:
                await self._board.post.remote(*self.metrics())
            except Exception:  # the board is being replaced: the next post reaches its successor
                pass
            await asyncio.sleep(self._interval)

    async def __del__(self):
        if self._poster is not None:
            self._poster.cancel()
        try:
            if hasattr(self, "llm"):
                await self.llm.shutdown()
        finally:
            if self._poster is not None:
                # NOTE: when the whole application is deleted, the board may be gone already (the call then fails)
                # or going (it may never answer): there is then no one to tell
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._board.remove.remote(self.replica_id), self._interval * 2)
