"""What a server needs of an engine: the ``EngineClient`` protocol (vLLM's ``engine/protocol.py``).

The OpenAI server (``entrypoints/openai``) talks to its engine through this protocol and nothing else. Two
classes implement it: ``AsyncLLM`` (one engine, stepped by its own thread in this process) and the Ray Serve
front's ``ReplicaEngineClient`` (engine replicas behind a deployment handle). Their errors are the three below,
which the server answers with 503 (not ready, dead) or 429 (overloaded).

Everything here runs on the event loop of the server: a client is started from it (``start``), and its
coroutines are awaited on it. A client never hands out the engine itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from minivllm.lora.request import LoRARequest
from minivllm.outputs import RequestOutput, StepStats
from minivllm.sampling_params import SamplingParams
from minivllm.structured_outputs_params import StructuredOutputsParams


class EngineNotReadyError(RuntimeError):
    """The engine is still loading, or is shutting down: try again later (HTTP 503)."""


class EngineDeadError(RuntimeError):
    """The engine loop failed; no request can run any more (HTTP 503)."""


class EngineOverloadedError(RuntimeError):
    """Too many sequences are waiting for the engine already: try again later (HTTP 429)."""


@dataclass(frozen=True)
class ModelInfo:
    """What a server needs to know of the served model and its engine: it tokenizes and checks lengths itself."""

    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    kvcache_block_size: int
    num_kvcache_blocks: int
    max_logprobs: int = 20  # the most logprobs a request may ask for (-1: the whole vocabulary)
    skip_tokenizer_init: bool = False  # the engine loads no tokenizer: prompts and outputs are token ids


class StatLogger(Protocol):
    """Receives what an engine does (``PrometheusStatLogger``). ``on_step`` and ``on_abort`` run on the engine
    loop thread, ``on_cache_config`` on the event loop: an implementation must be thread-safe."""

    def on_cache_config(self, block_size: int, num_blocks: int, max_model_len: int) -> None:
        """Once, when the engine is ready: its KV cache's block size and block count, and the model's context."""

    def on_step(self, outputs: list[RequestOutput], stats: StepStats, now: float) -> None:
        """After each engine step: the step's outputs and statistics (``now``: ``time.monotonic()``)."""

    def on_abort(self, request_id: str, now: float) -> None:
        """A request that was in the engine was aborted."""


class OutputStream(Protocol):
    """One request's outputs as an async iterator; each output carries that step's deltas, and iteration ends
    after the one with ``finished`` set. A consumer that stops early (cancelled, or closing the iterator) aborts
    the request."""

    request_id: str
    finished: bool

    def __aiter__(self) -> AsyncIterator[RequestOutput]: ...

    def abort(self) -> None:
        """Abort the request unless it finished (idempotent)."""


class EngineClient(Protocol):
    """An engine as the server sees it.

    Life: ``start()`` (from the running event loop), ``await wait_ready()``, requests, then ``begin_shutdown()``
    (refuse new requests, end the ones in flight with finish reason "abort") and ``await shutdown()``.
    ``is_ready`` / ``error`` / ``check_usable`` say whether requests can run now. ``tokenizer`` and
    ``model_info()`` are available once ready.
    """

    def start(self) -> None:
        """Start loading the engine (in the background); call from the running event loop."""

    @property
    def is_ready(self) -> bool:
        """True once the engine can take requests, while it is healthy and not shutting down."""

    @property
    def error(self) -> BaseException | None:
        """Why the engine failed, if it did (then it takes no requests any more)."""

    async def wait_ready(self) -> None:
        """Wait until the engine is ready (after ``start``); EngineDeadError if loading it failed."""

    async def wait_dead(self) -> BaseException | None:
        """Wait until the engine has failed, or the client shut down; returns why it failed (None: shut down)."""

    def check_usable(self) -> None:
        """EngineDeadError or EngineNotReadyError unless requests can be added now."""

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (None until ready, or for a model without one); use it off the event
        loop for anything but short texts."""

    def model_info(self) -> ModelInfo:
        """The served model's lengths, vocabulary and KV cache; EngineNotReadyError (or EngineDeadError) before
        the engine is ready."""

    async def add_request(self, prompt: str | list[int], params: SamplingParams,
                          request_id: str | None = None, lora_request: LoRARequest | None = None) -> OutputStream:
        """Queue a request (``lora_request``: its LoRA adapter, None for the base model); returns its output
        stream once the engine accepted it. Raises ValueError (bad prompt or parameters, prompt + max_tokens over
        max_model_len, a request id in use, a bad adapter or LoRA not enabled), EngineNotReadyError,
        EngineDeadError or EngineOverloadedError."""

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Make a LoRA adapter known to the engine, its folder checked (ValueError naming what is wrong)."""

    async def remove_lora(self, lora_int_id: int) -> bool:
        """Forget a LoRA adapter; False if the engine did not know it."""

    async def list_loras(self) -> set[int]:
        """The ids of the LoRA adapters the engine knows."""

    def abort(self, request_id: str) -> None:
        """Abort a request and free its KV blocks (unknown or finished ids are ignored)."""

    async def compile_grammar(self, params: StructuredOutputsParams) -> None:
        """Compile ``params``' grammar off the event loop, where the engine will find it compiled (cached by
        constraint); ValueError naming the field (``structured_outputs``) for an invalid schema, regex or grammar,
        or when the model has no tokenizer."""

    def add_stat_logger(self, stat_logger: StatLogger) -> None:
        """Report the engine's steps and aborts to ``stat_logger`` from now on (a client whose engines report their
        own metrics elsewhere may ignore it)."""

    def begin_shutdown(self) -> None:
        """Refuse new requests and end the ones in flight (finish reason "abort"); call on the event loop."""

    async def shutdown(self, timeout: float = 30.0) -> None:
        """``begin_shutdown``, then stop the engine and release what it holds."""
