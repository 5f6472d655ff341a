"""AsyncLLM: an engine stepped by its own thread, driven from asyncio (continuous batching).

The engine is not thread-safe, so an ``EngineLoop`` thread builds it and makes every engine call.
This module is the asyncio side, and the single-engine ``EngineClient`` (``engine/protocol.py``):
``add_request`` sends an ``AddRequest`` command and awaits the engine's verdict (its ValueError reaches
the caller), and each step's outputs come back with ``loop.call_soon_threadsafe`` into one
``asyncio.Queue`` per request. The event loop never blocks on the model; requests that arrive
mid-flight join the next step. Outside the engine loop, only this class reads the engine, and only what
does not change once it is built (its tokenizer, config and KV cache size) or is thread-safe (its grammar
cache).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from minivllm.engine.engine_loop import AddLoRA, EngineLoop, ListLoRAs, LoRACommand, RemoveLoRA
from minivllm.engine.protocol import (
    EngineDeadError,
    EngineNotReadyError,
    EngineOverloadedError,
    ModelInfo,
    StatLogger,
)
from minivllm.lora.request import LoRARequest
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.structured_outputs_params import StructuredOutputsParams

__all__ = ["AsyncLLM", "EngineDeadError", "EngineNotReadyError", "EngineOverloadedError", "RequestStream",
           "StatLogger"]

logger = logging.getLogger(__name__)

_ABORTED = object()  # queued to a stream that was aborted from the asyncio side


class RequestStream:
    """One request's outputs as an async iterator (each item carries that step's deltas).

    Iteration ends after the output with ``finished`` set. If the consumer stops early (it is
    cancelled, or it closes the iterator), the request is aborted and its KV blocks are freed.
    """

    def __init__(self, llm: AsyncLLM, request_id: str, params: SamplingParams):
        self.request_id, self.params, self.finished = request_id, params, False
        self._llm = llm
        self._queue: asyncio.Queue = asyncio.Queue()
        self._last: RequestOutput | None = None

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                if item is _ABORTED:
                    item = self._aborted_output()
                self.finished, self._last = item.finished, item
                yield item
        finally:
            self.abort()

    def _aborted_output(self) -> RequestOutput:
        """The final output of a request aborted from outside: what it had, finish_reason "abort"."""
        last = self._last
        if last is None:
            return RequestOutput(self.request_id, None, [], [CompletionOutput(i, finish_reason="abort")
                                                             for i in range(self.params.n)], finished=True)
        outs = [CompletionOutput(o.index, o.text, list(o.token_ids), o.finish_reason or "abort", o.stop_reason,
                                 o.logprobs) for o in last.outputs]
        return RequestOutput(self.request_id, last.prompt, last.prompt_token_ids, outs, finished=True)

    def abort(self) -> None:
        """Abort the request unless it already finished (idempotent; call on the event loop)."""
        if not self.finished:
            self.finished = True
            self._llm.abort(self.request_id)


class AsyncLLM:
    """An ``LLMEngine`` on its own thread, with an asyncio API: an ``EngineClient``.

    ``AsyncLLM.from_model(path, **engine_kwargs)`` or ``AsyncLLM(engine_factory)``; call
    :meth:`start` inside the running event loop, then ``await add_request(...)`` (or iterate
    :meth:`generate`), and ``await shutdown()`` at the end. ``max_num_waiting`` (None: no bound) caps the
    sequences waiting for the engine: a request beyond it raises EngineOverloadedError.
    """

    def __init__(self, engine_factory: Callable[[], Any], stat_loggers: Iterable[StatLogger] = (),
                 max_num_waiting: int | None = None):
        self._factory = engine_factory
        self.max_num_waiting = max_num_waiting
        self.stat_loggers: list[StatLogger] = list(stat_loggers)
        self._streams: dict[str, RequestStream] = {}
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: EngineLoop | None = None
        self._engine: Any = None  # the engine loop's engine once it is built (set on the event loop)
        self._info: ModelInfo | None = None
        self._ready_event: asyncio.Event | None = None
        self._dead_event: asyncio.Event | None = None

    @classmethod
    def from_model(cls, model: str, stat_loggers: Iterable[StatLogger] = (), max_num_waiting: int | None = None,
                   **engine_kwargs) -> AsyncLLM:
        """An AsyncLLM that builds ``LLMEngine(model, **engine_kwargs)`` on its thread."""
        def factory():
            from minivllm.engine.llm_engine import LLMEngine

            return LLMEngine(model, **engine_kwargs)

        return cls(factory, stat_loggers, max_num_waiting)

    # ------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the engine loop thread (it builds the engine); call from the running event loop."""
        if self._worker is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._ready_event = asyncio.Event()
        self._dead_event = asyncio.Event()
        self._worker = EngineLoop(self._factory, self.stat_loggers, on_ready=self._threadsafe(self._on_ready),
                                  on_outputs=self._threadsafe(self._dispatch),
                                  on_failed=self._threadsafe(self._on_failed))
        self._worker.start()

    @property
    def error(self) -> BaseException | None:
        """The exception that stopped the engine loop, if any."""
        return self._worker.error if self._worker is not None else None

    @property
    def is_ready(self) -> bool:
        """True once the engine is built, while it is healthy and not shutting down."""
        return self._info is not None and self.error is None and not self._stopping

    async def wait_dead(self) -> BaseException:
        """Wait until the engine loop has failed (after :meth:`start`); returns why."""
        await self._dead_event.wait()
        return self.error

    async def wait_ready(self) -> None:
        """Wait until the engine is built (after :meth:`start`); raises EngineDeadError if that failed."""
        await self._ready_event.wait()
        if self.error is not None:
            raise EngineDeadError(f"the engine failed: {self.error!r}") from self.error

    @property
    def tokenizer(self):
        """The engine's Hugging Face tokenizer (read-only use from the event loop is fine); None until ready."""
        return self._engine.tokenizer if self._engine is not None else None

    def model_info(self) -> ModelInfo:
        """The model's lengths, vocabulary and KV cache (EngineNotReadyError until the engine is built)."""
        if self._info is None:
            self.check_usable()  # raises: loading, failed, or shutting down before it loaded
        return self._info

    def add_stat_logger(self, stat_logger: StatLogger) -> None:
        """Report to ``stat_logger`` too (its ``on_cache_config`` at once if the engine is ready)."""
        self.stat_loggers.append(stat_logger)
        if self._info is not None:
            self._tell_cache_config(stat_logger)

    def begin_shutdown(self) -> None:
        """Refuse new requests and abort the ones in flight (their streams end with "abort")."""
        self._stopping = True
        for request_id in list(self._streams):
            self.abort(request_id)

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Abort everything, stop the engine loop thread and close the engine."""
        self.begin_shutdown()
        if self._worker is not None:
            await asyncio.to_thread(self._worker.stop, timeout)

    # ------------------------------------------------------------- requests
    def check_usable(self) -> None:
        """Raise EngineDeadError or EngineNotReadyError unless requests can be added now."""
        if self.error is not None:
            raise EngineDeadError(f"the engine failed: {self.error!r}")
        if self._stopping:
            raise EngineNotReadyError("the server is shutting down")
        if self._info is None:
            raise EngineNotReadyError("the engine is still loading")

    async def add_request(self, prompt: str | list[int], params: SamplingParams,
                          request_id: str | None = None, lora_request: LoRARequest | None = None) -> RequestStream:
        """Queue a request; returns its output stream once the engine accepted it.

        Raises ValueError (bad prompt or parameters, or prompt + max_tokens over max_model_len, a bad
        ``lora_request``), EngineNotReadyError or EngineDeadError. Every online request reports each step, with
        its text detokenized incrementally (``delta_text``), whether the client streams or not.
        """
        self.check_usable()
        waiting = self._worker.num_waiting
        if self.max_num_waiting is not None and waiting + params.n > self.max_num_waiting:
            raise EngineOverloadedError(f"{waiting} sequences are waiting for the engine (at most "
                                        f"{self.max_num_waiting}): try again later")
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        rs = self._streams[request_id] = RequestStream(self, request_id, params)
        try:
            await asyncio.wrap_future(self._worker.add(request_id, prompt, params, lora_request))
        except asyncio.CancelledError:
            rs.abort()  # the add may still happen: the abort queued behind it undoes it
            raise
        except BaseException:
            rs.finished = True
            self._streams.pop(request_id, None)
            raise
        return rs

    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       request_id: str | None = None, lora_request: LoRARequest | None = None
                       ) -> AsyncIterator[RequestOutput]:
        """Add a request and yield its outputs; stopping the iteration early aborts it."""
        rs = await self.add_request(prompt, params, request_id, lora_request)
        async for out in rs:
            yield out

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Make a LoRA adapter known to the engine (``LLMEngine.add_lora``: ValueError naming what is wrong with
        its folder)."""
        return await self._lora(AddLoRA(lora_request, concurrent.futures.Future()))

    async def remove_lora(self, lora_int_id: int) -> bool:
        """Forget a LoRA adapter (requests running with it finish with it); False if unknown."""
        return await self._lora(RemoveLoRA(lora_int_id, concurrent.futures.Future()))

    async def list_loras(self) -> set[int]:
        """The ids of the LoRA adapters the engine knows."""
        return await self._lora(ListLoRAs(concurrent.futures.Future()))

    async def _lora(self, cmd: LoRACommand):
        """Run a LoRA command on the engine loop thread."""
        self.check_usable()
        return await asyncio.wrap_future(self._worker.lora(cmd))

    def abort(self, request_id: str) -> None:
        """Abort a request and free its KV blocks now (call on the event loop; unknown ids are ignored)."""
        rs = self._streams.pop(request_id, None)
        if rs is not None:
            rs._queue.put_nowait(_ABORTED)
            self._worker.abort(request_id)

    async def compile_grammar(self, params: StructuredOutputsParams) -> None:
        """Compile the grammar of ``params`` on a worker thread into the engine's grammar cache (its ``prepare`` is
        thread-safe), so that the engine finds it compiled; ValueError naming the field for an invalid one."""
        if self._engine is None:
            self.check_usable()
        structured = self._engine.structured
        if structured is None:
            raise ValueError("structured outputs need a tokenizer, and this model has none")
        await asyncio.to_thread(structured.prepare, params)

    # ------------------------------------------- called from the engine loop
    def _threadsafe(self, fn: Callable) -> Callable:
        def call(*args) -> None:
            try:
                self._loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the event loop is closed: nobody is listening any more
                pass

        return call

    def _on_ready(self) -> None:
        engine = self._worker.engine
        try:
            mc, cc = engine.config.model_config, engine.config.cache_config
            self._info = ModelInfo(mc.max_model_len, mc.arch.vocab_size, tuple(engine.eos_token_ids),
                                   cc.kvcache_block_size, engine.num_kvcache_blocks, mc.max_logprobs,
                                   mc.skip_tokenizer_init)
            self._engine = engine
            for sl in tuple(self.stat_loggers):
                self._tell_cache_config(sl)
        finally:
            self._ready_event.set()

    def _tell_cache_config(self, sl: StatLogger) -> None:
        try:
            sl.on_cache_config(self._info.kvcache_block_size, self._info.num_kvcache_blocks, self._info.max_model_len)
        except Exception:  # a metrics bug must not take the engine down
            logger.exception("stat logger %r failed in on_cache_config", sl)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            rs = self._streams.get(out.request_id)
            if rs is not None:
                rs._queue.put_nowait(out)
                if out.finished:
                    del self._streams[out.request_id]

    def _on_failed(self, exc: BaseException) -> None:
        err = EngineDeadError(f"the engine failed: {exc!r}")
        for rs in self._streams.values():
            rs._queue.put_nowait(err)
        self._streams.clear()
        self._ready_event.set()
        self._dead_event.set()
