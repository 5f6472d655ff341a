"""EngineLoop: the one thread that builds and owns an engine, and makes every call into it.

Other threads talk to it only through a thread-safe queue of commands (``AddRequest``, ``AbortRequest``,
``AddLoRA``, ``RemoveLoRA``, ``ListLoRAs``, ``Stop``).
The thread drains the queue, steps the engine while it has work (a request added mid-flight joins
the next step: continuous batching), tells the stat loggers, and hands each step's outputs to the
``on_outputs`` callback; when idle it blocks on the queue.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minivllm.engine.protocol import EngineDeadError, StatLogger
from minivllm.lora.request import LoRARequest
from minivllm.outputs import RequestOutput, StepStats
from minivllm.sampling_params import SamplingParams

__all__ = ["AbortRequest", "AddLoRA", "AddRequest", "EngineLoop", "ListLoRAs", "RemoveLoRA", "Stop"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AddRequest:
    """Add a request to the engine; ``future`` gets the request id, or the engine's ValueError."""

    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    future: concurrent.futures.Future
    lora_request: LoRARequest | None = None


@dataclass(frozen=True)
class AbortRequest:
    """Abort a request (its KV blocks are freed before the next step); unknown ids are ignored."""

    request_id: str


@dataclass(frozen=True)
class AddLoRA:
    """``engine.add_lora``: ``future`` gets True, or the ValueError naming what is wrong with the adapter."""

    lora_request: LoRARequest
    future: concurrent.futures.Future


@dataclass(frozen=True)
class RemoveLoRA:
    """``engine.remove_lora``: ``future`` gets whether the adapter was known."""

    lora_int_id: int
    future: concurrent.futures.Future


@dataclass(frozen=True)
class ListLoRAs:
    """``engine.list_loras``: ``future`` gets the known adapters' ids."""

    future: concurrent.futures.Future


LoRACommand = AddLoRA | RemoveLoRA | ListLoRAs


@dataclass(frozen=True)
class Stop:
    """Leave the loop (after the commands queued before this one) and close the engine."""


Command = AddRequest | AbortRequest | LoRACommand | Stop


class EngineLoop:
    """Runs ``engine = factory()`` and then the step loop on a daemon thread.

    Callbacks run on that thread: ``on_ready()`` once the engine is built, ``on_outputs(outputs)``
    after each step that produced some, ``on_failed(exc)`` if building or stepping raised (the
    loop then ends; ``error`` holds the exception). ``stat_loggers`` get ``on_step`` / ``on_abort``.
    """

    def __init__(self, factory: Callable[[], Any], stat_loggers: list[StatLogger], on_ready: Callable[[], None],
                 on_outputs: Callable[[list[RequestOutput]], None], on_failed: Callable[[BaseException], None]):
        self._factory, self.stat_loggers = factory, stat_loggers
        self._on_ready, self._on_outputs, self._on_failed = on_ready, on_outputs, on_failed
        self.engine: Any = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self._commands: queue.Queue[Command] = queue.Queue()
        self._live: set[str] = set()  # requests in the engine (for the abort statistics)
        self._queued_seqs = 0  # sequences of AddRequest commands not yet run (written by both threads)
        self._queued_lock = threading.Lock()
        self.engine_waiting = 0  # sequences the scheduler had waiting after the latest step
        self._thread = threading.Thread(target=self._run, name="minivllm-engine-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for the engine: queued adds plus the scheduler's waiting queue."""
        return self._queued_seqs + self.engine_waiting

    def add(self, request_id: str, prompt, params, lora_request: LoRARequest | None = None
            ) -> concurrent.futures.Future:
        """Queue an ``engine.add_request``; the future gets its result or its ValueError."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._queued_lock:
            self._queued_seqs += params.n
        self._commands.put(AddRequest(request_id, prompt, params, fut, lora_request))
        if self.error is not None:  # the loop is gone: nobody else will answer
            self._fail_commands()
        return fut

    def lora(self, cmd: LoRACommand) -> concurrent.futures.Future:
        """Queue a LoRA command; returns its future (its result, or the engine's ValueError)."""
        self._commands.put(cmd)
        if self.error is not None:
            self._fail_commands()
        return cmd.future

    def abort(self, request_id: str) -> None:
        """Queue an ``engine.abort_request`` (frees the request's KV blocks before the next step)."""
        self._commands.put(AbortRequest(request_id))

    def stop(self, timeout: float | None = None) -> None:
        """Finish the queued commands, leave the loop, close the engine and join the thread."""
        self._commands.put(Stop())
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ---------------------------------------------------------- on the thread
    def _run(self) -> None:
        try:
            self.engine = self._factory()
        except BaseException as exc:
            logger.exception("building the engine failed")
            return self._die(exc)
        self.ready.set()
        self._on_ready()
        try:
            while True:
                busy = self.engine.has_unfinished_requests()
                changed = self._drain(block=not busy)
                if changed is None:
                    break
                if busy or changed:  # an idle step after aborts refreshes the KV cache statistics
                    outputs, stats = self.engine.step()
                    self._publish(outputs, stats)
        except BaseException as exc:
            logger.exception("the engine loop failed")
            self._die(exc)
        finally:
            try:
                self.engine.close()
            except Exception:  # pragma: no cover
                logger.exception("closing the engine failed")

    def _drain(self, block: bool) -> bool | None:
        """Run the queued commands; True if any changed the engine, None on ``Stop``."""
        changed = False
        while True:
            try:
                cmd = self._commands.get(block=block)
            except queue.Empty:
                return changed
            block = False
            match cmd:
                case Stop():
                    return None
                case AddRequest():
                    if not self._add(cmd):
                        continue
                case AbortRequest():
                    self._abort(cmd.request_id)
                case AddLoRA() | RemoveLoRA() | ListLoRAs():
                    self._lora(cmd)
                    continue
            changed = True

    def _add(self, cmd: AddRequest) -> bool:
        """Run an ``AddRequest``; False if the engine refused it (its future holds why)."""
        with self._queued_lock:
            self._queued_seqs -= cmd.params.n
        # a caller cancelled while its request waited here (its client left, or its batch failed) cancelled the
        # future: the request is not added (the abort queued behind it finds nothing); otherwise the future can no
        # longer be cancelled, so setting its result below cannot fail
        if not cmd.future.set_running_or_notify_cancel():
            return False
        try:
            # every online request reports each step (metrics, aborts), streamed or not
            self.engine.add_request(cmd.prompt, cmd.params, request_id=cmd.request_id, stream=True,
                                    strict_length=True, lora_request=cmd.lora_request)
        except Exception as exc:
            cmd.future.set_exception(exc)
            return False
        cmd.future.set_result(cmd.request_id)
        self._live.add(cmd.request_id)
        self.engine_waiting += cmd.params.n  # until the next step's statistics say exactly
        return True

    def _lora(self, cmd: LoRACommand) -> None:
        if not cmd.future.set_running_or_notify_cancel():
            return
        try:
            match cmd:
                case AddLoRA(lora_request=lora):
                    result = self.engine.add_lora(lora)
                case RemoveLoRA(lora_int_id=lora_int_id):
                    result = self.engine.remove_lora(lora_int_id)
                case ListLoRAs():
                    result = self.engine.list_loras()
        except Exception as exc:
            cmd.future.set_exception(exc)
            return
        cmd.future.set_result(result)

    def _abort(self, request_id: str) -> None:
        self.engine.abort_request(request_id)
        if request_id in self._live:
            self._live.discard(request_id)
            now = time.monotonic()
            self._notify("on_abort", lambda sl: sl.on_abort(request_id, now))

    def _publish(self, outputs: list[RequestOutput], stats: StepStats) -> None:
        self.engine_waiting = stats.num_waiting
        for out in outputs:
            if out.finished:
                self._live.discard(out.request_id)
        now = time.monotonic()
        self._notify("on_step", lambda sl: sl.on_step(outputs, stats, now))
        if outputs:
            self._on_outputs(outputs)

    def _notify(self, what: str, call: Callable[[StatLogger], None]) -> None:
        """``call(sl)`` for every stat logger (``what`` names the method, for the log)."""
        for sl in tuple(self.stat_loggers):
            try:
                call(sl)
            except Exception:  # a metrics bug must not take the engine down
                logger.exception("stat logger %r failed in %s", sl, what)

    def _die(self, exc: BaseException) -> None:
        self.error = exc
        self._fail_commands()
        self._on_failed(exc)

    def _fail_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if not isinstance(cmd, (AbortRequest, Stop)) and not cmd.future.done():
                cmd.future.set_exception(EngineDeadError(f"the engine failed: {self.error!r}"))
