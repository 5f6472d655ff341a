"""The OpenAI front's engine: an ``EngineClient`` (``engine/protocol.py``) over the engine replicas' deployment handle.

The server's handlers (``entrypoints/openai``) run unchanged on it: they tokenize with the front's own tokenizer,
compile grammars with its own manager (``compile_grammar``: an invalid schema gets its 400 before any replica
sees it), and ``add_request`` makes a ``generate`` call that Serve's router sends to one replica. The request's outputs come
back on this front's channel to that replica (one streaming ``outputs`` call per replica, batched per step), and
are handed to the request's stream here.

When a replica dies under a request (vLLM's behaviour for a lost engine, per request): if nothing of the request
reached the handler yet, it is sent once more, to another replica; otherwise the stream ends with
:class:`ReplicaDiedError` (a 503, or an SSE error event once streaming began). Serve starts a new replica.
"""

from __future__ import annotations

import asyncio
import uuid

from minivllm.engine.protocol import EngineDeadError, EngineNotReadyError, ModelInfo, StatLogger
from minivllm.lora.request import LoRARequest
from minivllm.sampling_params import SamplingParams
from minivllm.scale_out.serve.outbox import RequestFailed
from minivllm.scale_out.serve.replica import Channel, ReplicaRequest
from minivllm.scale_out.serve.replica_stream import ReplicaDiedError, ReplicaStream, unwrap
from minivllm.structured_outputs_params import StructuredOutputsParams

_CHANNEL_OPEN_S = 60.0  # a channel that does not open by then: its replica is gone


class ReplicaEngineClient:
    """The ``EngineClient`` of the front: requests go to a handle to the ``EngineReplica`` deployment."""

    def __init__(self, engines, model: str, structured_outputs_config=None, on_retry=lambda: None):
        self.engines, self.model = engines, model
        self.front_id = uuid.uuid4().hex
        self.stat_loggers: list[StatLogger] = []  # never called: the replicas post their engine's metrics
        self._streams: dict[str, ReplicaStream] = {}
        self._channels: dict[str, asyncio.Task] = {}
        self._so_config, self.on_retry = structured_outputs_config, on_retry
        self._init: asyncio.Task | None = None
        self._stopping = False
        self._tokenizer, self._info, self._structured = None, None, None
        self._dead = asyncio.Event()
        # LoRA adapters added here or named by a request; each request carries its adapter whole, so a replica that
        # has not seen it checks and adds it then
        self._loras: dict[int, LoRARequest] = {}

    def start(self) -> None:
        """Load the tokenizer and ask a replica for the model's lengths (in the background; see :meth:`load`)."""
        if self._init is None:
            self._init = asyncio.get_running_loop().create_task(self._load())

    async def load(self) -> None:
        """Load now (the front does, so that Serve reports it running only once it can serve)."""
        self.start()
        await self.wait_ready()

    async def _load(self) -> None:
        from minivllm.engine.structured_output import StructuredOutputManager
        from minivllm.engine.tokenizer import load_tokenizer

        info: ModelInfo = await self.engines.model_info.remote()
        tokenizer = None if info.skip_tokenizer_init else await asyncio.to_thread(load_tokenizer, self.model)
        structured = None if tokenizer is None else StructuredOutputManager(
            tokenizer, info.vocab_size, list(info.eos_token_ids), self._so_config)
        self._tokenizer, self._info, self._structured = tokenizer, info, structured

    @property
    def error(self) -> BaseException | None:
        """Why loading failed, if it did."""
        if self._init is None or not self._init.done() or self._init.cancelled():
            return None
        return self._init.exception()

    @property
    def is_ready(self) -> bool:
        return self._info is not None and not self._stopping

    async def wait_ready(self) -> None:
        """Wait until the front can serve; EngineDeadError if loading failed."""
        try:
            await asyncio.shield(self._init)
        except Exception as exc:
            raise EngineDeadError(f"the front could not load the model's tokenizer or info: {exc!r}") from exc

    async def wait_dead(self) -> BaseException:
        """Replicas are replaced by Serve, so the front never dies: this waits until shutdown."""
        await self._dead.wait()
        return self.error

    @property
    def tokenizer(self):
        return self._tokenizer

    def model_info(self) -> ModelInfo:
        """The replicas' model (asked of one replica when the front loaded)."""
        if self._info is None:
            self.check_usable()
        return self._info

    def add_stat_logger(self, stat_logger: StatLogger) -> None:
        """Kept, never called: each replica's engine reports to its own stat logger, and the front merges their
        metrics (``metrics.py``)."""
        self.stat_loggers.append(stat_logger)

    async def compile_grammar(self, params: StructuredOutputsParams) -> None:
        """Compile the grammar with the front's own compiler, on a worker thread: an invalid one gets its
        ValueError here, before any replica sees the request (each replica compiles it too, once per
        constraint: a grammar does not travel between processes)."""
        if self._info is None:
            self.check_usable()
        if self._structured is None:
            raise ValueError("structured outputs need a tokenizer, and this model has none")
        await asyncio.to_thread(self._structured.prepare, params)

    def check_usable(self) -> None:
        """EngineNotReadyError / EngineDeadError unless requests can be sent now."""
        if self.error is not None:
            raise EngineDeadError(f"the front failed to start: {self.error!r}")
        if self._stopping:
            raise EngineNotReadyError("the server is shutting down")
        if self._info is None:
            raise EngineNotReadyError("the engine replicas are still loading")

    async def add_request(self, prompt: str | list[int], params: SamplingParams,
                          request_id: str | None = None, lora_request: LoRARequest | None = None) -> ReplicaStream:
        """Send a request (with its LoRA adapter, if any) to a replica; returns its stream once the replica
        accepted it."""
        self.check_usable()
        if isinstance(prompt, str) and self._tokenizer is not None:  # token ids, for prefix affinity
            prompt = await asyncio.to_thread(self._tokenizer.encode, prompt)
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        stream = self._streams[request_id] = ReplicaStream(self, ReplicaRequest(request_id, prompt, params,
                                                                                 lora_request))
        try:  # NOTE: registered first: its first outputs may come on the channel before the call returns
            await stream.open()
        except BaseException:
            self.forget(request_id)
            raise
        if lora_request is not None:
            self._loras.setdefault(lora_request.lora_int_id, lora_request)
        return stream

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Check a LoRA adapter on one replica (ValueError naming what is wrong) and list it here; the other
        replicas add it when a request first names it."""
        self.check_usable()
        try:
            await self.engines.add_lora.remote(lora_request)
        except BaseException as exc:
            raise unwrap(exc) from None
        self._loras[lora_request.lora_int_id] = lora_request
        return True

    async def remove_lora(self, lora_int_id: int) -> bool:
        """Stop listing a LoRA adapter, and forget it on one replica; False if it was not listed.
        NOTE: replicas that ran it keep its id bound to its folder (another folder under that id is refused there)."""
        self.check_usable()
        if self._loras.pop(lora_int_id, None) is None:
            return False
        try:
            await self.engines.remove_lora.remote(lora_int_id)
        except BaseException as exc:
            raise unwrap(exc) from None
        return True

    async def list_loras(self) -> set[int]:
        """The ids of the LoRA adapters added here or named by a request."""
        return set(self._loras)

    def abort(self, request_id: str) -> None:
        """Abort a request: its call is cancelled, and the replica aborts it (unknown ids are ignored)."""
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.abort()

    def forget(self, request_id: str) -> None:
        """Stop delivering a request's outputs (it finished, failed or was aborted)."""
        self._streams.pop(request_id, None)

    def ensure_channel(self, replica: str) -> None:
        """Open this front's output channel to ``replica`` unless it is open."""
        if replica not in self._channels:
            self._channels[replica] = asyncio.create_task(self._channel(replica))

    async def _channel(self, replica: str) -> None:
        call = self.engines.options(stream=True).outputs.remote(Channel(replica, self.front_id))
        error: BaseException = ReplicaDiedError(f"the output channel of replica {replica} closed")
        try:
            await asyncio.wait_for(call.__anext__(), _CHANNEL_OPEN_S)
            while True:
                for item in await call.__anext__():
                    self._deliver(item)
        except asyncio.CancelledError:
            call.cancel()
            raise
        except BaseException as exc:  # the replica died or shut down: its requests' own calls say so too
            if not isinstance(exc, StopAsyncIteration):
                error = unwrap(exc)
            call.cancel()
        finally:
            self._channels.pop(replica, None)
        for stream in [s for s in self._streams.values() if s.replica == replica and not s.finished]:
            stream.on_lost(error, replica)

    def _deliver(self, item) -> None:
        stream = self._streams.get(item.request_id)
        if stream is None:  # aborted here already
            return
        if isinstance(item, RequestFailed):
            self.forget(item.request_id)
            stream.deliver(ReplicaDiedError(f"request {item.request_id}: {item.message}"))
            return
        if item.finished:
            self.forget(item.request_id)
        stream.deliver(item)

    def begin_shutdown(self) -> None:
        self._stopping = True

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Refuse new requests; stop the grammar compiler."""
        self.begin_shutdown()
        self._dead.set()
        for task in list(self._channels.values()):
            task.cancel()
        if self._structured is not None:
            self._structured.close()
