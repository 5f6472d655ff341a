"""The OpenAI-compatible HTTP server: a FastAPI app on an ``EngineClient`` (``engine/protocol.py``), run by
uvicorn. ``run_server`` serves one engine (``AsyncLLM``); the Ray Serve front (``scale_out/serve``) builds the
same app on its client of the engine replicas.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models`` (the served model and its
LoRA adapters; a request's ``model`` picks one), ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``
(with ``--enable-lora-runtime-updates``),
``GET /health``, ``GET /metrics``, ``POST /tokenize``, ``POST /detokenize``, ``GET /version``,
``GET /tokenizer_info`` (with ``--enable-tokenizer-info-endpoint``); vLLM's ``POST /v1/chat/completions/batch``,
``POST /v1/decisions``, ``GET /load``, and SageMaker's
``POST /invocations`` and ``GET|POST /ping``. Every error is answered in OpenAI's ``{"error": {...}}`` shape:
400 for bad input (pydantic's included), 401 without a valid API key, 404 for a model or adapter not served, 413
for a body over the cap, 429 when too many sequences wait, 503 while the engine loads or after it failed (the
server then exits non-zero, for a supervisor to restart it).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from minivllm import __version__
from minivllm.config.server import ServerConfig
from minivllm.engine.async_engine import AsyncLLM
from minivllm.engine.protocol import EngineClient, EngineDeadError, EngineNotReadyError, EngineOverloadedError
from minivllm.engine.tokenizer import chat_template_args
from minivllm.entrypoints.openai import decisions_protocol as D
from minivllm.entrypoints.openai import protocol as P
from minivllm.entrypoints.openai.errors import APIError, error_json
from minivllm.entrypoints.openai.guards import RequestGuard, RequestIdHeader, guarded_h11
from minivllm.entrypoints.openai.inputs import RequestLimits
from minivllm.entrypoints.openai.load import LoadCounter, OrcaLoadHeader, ServerLoad
from minivllm.entrypoints.openai.metrics import PrometheusStatLogger
from minivllm.entrypoints.openai.parsing import add_schemas, body_schema, parse_body, parse_first
from minivllm.entrypoints.openai.reasoning import HARMONY_REASONING_PARSERS
from minivllm.entrypoints.openai.serving import OpenAIServing
from minivllm.entrypoints.openai.serving_base import ChatParsers, UsageOptions
from minivllm.entrypoints.openai.serving_batch import BatchChatServing
from minivllm.entrypoints.openai.serving_decisions import DecisionServing
from minivllm.entrypoints.openai.serving_models import ServedModels
from minivllm.entrypoints.openai.tokenizer_info import tokenizer_info_of

logger = logging.getLogger("minivllm.server")


def _validation_error(exc: RequestValidationError):
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_json(APIError(400, f"the request body is not valid JSON: "
                                        f"{errors[0].get('ctx', {}).get('error', '')}".rstrip(": ")))

    def where(e) -> str:
        return ".".join(str(x) for x in e.get("loc", ()) if x != "body")

    # each with pydantic's error type (``greater_than_equal``...), which vLLM's message carries and clients match
    msg = "; ".join(f"{where(e) or 'body'}: {e.get('msg')} [type={e.get('type')}]" for e in errors[:5])
    return error_json(APIError(400, msg or "invalid request", param=(where(errors[0]) or None) if errors else None))


def build_app(async_llm: EngineClient, served_model_name: str, config: ServerConfig | None = None,
              metrics: Callable[[], Awaitable[bytes]] | None = None,
              load_report: Callable[[], Awaitable[dict[str, float]]] | None = None,
              lora_enabled: bool = False) -> FastAPI:
    """The FastAPI app (``RequestGuard`` in front of its routes); its lifespan starts the engine and shuts it
    down. ``metrics`` renders ``/metrics`` and ``load_report`` gives the ORCA load report (default: this engine's);
    ``lora_enabled``: the engine serves LoRA adapters (``--enable-lora``). ``app.state.loop`` is the event loop the
    app runs on (set by the lifespan), for a signal handler to begin the engine's shutdown there;
    ``app.state.startup_error`` why the server could not start serving (an adapter of ``--lora-modules``)."""
    config = config or ServerConfig()
    models = ServedModels(async_llm, served_model_name, config.lora_modules, lora_enabled)
    stats = PrometheusStatLogger(served_model_name)
    async_llm.add_stat_logger(stats)
    limits = RequestLimits(config.max_n, config.max_stop_strings, config.max_stop_string_chars,
                           config.trust_request_chat_template)
    harmony = config.tool_call_parser == "openai" or config.reasoning_parser in HARMONY_REASONING_PARSERS
    serving = OpenAIServing(async_llm, served_model_name, limits, ChatParsers(
        config.tool_call_parser if config.enable_auto_tool_choice else None, config.reasoning_parser, harmony),
        UsageOptions(config.enable_force_include_usage, config.enable_prompt_tokens_details),
        tokens_as_ids=config.return_tokens_as_token_ids, per_request_metrics=config.enable_per_request_metrics,
        models=models)
    batch = BatchChatServing(serving)
    decisions = DecisionServing(serving)
    in_flight = LoadCounter()
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.loop = asyncio.get_running_loop()
        async_llm.start()
        watcher = asyncio.create_task(_watch_engine(app, async_llm, models))
        yield
        watcher.cancel()
        await async_llm.shutdown()

    app = FastAPI(title="minivllm", version=__version__, lifespan=lifespan, root_path=config.root_path or "")
    app.state.async_llm, app.state.stats, app.state.served_model_name = async_llm, stats, served_model_name
    app.state.on_engine_failure, app.state.loop, app.state.startup_error = None, None, None

    async def on_validation_error(request: Request, exc: RequestValidationError):
        return _validation_error(exc)

    async def on_http_error(request: Request, exc: StarletteHTTPException):
        return error_json(APIError(exc.status_code, str(exc.detail)))

    async def on_error(request: Request, exc: Exception):
        if isinstance(exc, EngineOverloadedError):
            stats.on_admission_rejection()
        return error_json(exc)

    async def on_client_gone(request: Request, exc: ClientDisconnect):
        # the client left while sending its body: no one to answer, and nothing failed here (no traceback)
        logger.debug("the client left while sending %s %s", request.method, request.url.path)
        return Response(status_code=499)

    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(ClientDisconnect, on_client_gone)
    # the expected errors by class (Starlette re-raises what only the catch-all Exception handler took,
    # for the server to log as a crash, and closes the connection)
    for cls in (APIError, ValueError, EngineNotReadyError, EngineDeadError, EngineOverloadedError, Exception):
        app.add_exception_handler(cls, on_error)

    @app.post("/v1/completions", openapi_extra=body_schema(P.CompletionRequest))
    async def completions(raw: Request):
        return await serving.completions(await parse_body(raw, P.CompletionRequest), raw)

    @app.post("/v1/chat/completions", openapi_extra=body_schema(P.ChatCompletionRequest))
    async def chat_completions(raw: Request):
        return await serving.chat(await parse_body(raw, P.ChatCompletionRequest), raw)

    @app.get("/v1/models")
    async def list_models():
        max_model_len = async_llm.model_info().max_model_len if async_llm.is_ready else None
        return {"object": "list", "data": models.cards(created, max_model_len)}

    if config.enable_lora_runtime_updates:
        @app.post("/v1/load_lora_adapter", openapi_extra=body_schema(P.LoadLoRAAdapterRequest))
        async def load_lora_adapter(raw: Request):
            body = await parse_body(raw, P.LoadLoRAAdapterRequest)
            async_llm.check_usable()
            await models.load(body.lora_name, body.lora_path)
            return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.", media_type="text/plain")

        @app.post("/v1/unload_lora_adapter", openapi_extra=body_schema(P.UnloadLoRAAdapterRequest))
        async def unload_lora_adapter(raw: Request):
            body = await parse_body(raw, P.UnloadLoRAAdapterRequest)
            async_llm.check_usable()
            await models.unload(body.lora_name)
            return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.",
                            media_type="text/plain")

    @app.get("/health")
    async def health():
        if async_llm.is_ready and models.ready:
            return Response(status_code=200)
        if async_llm.is_ready:
            return error_json(EngineNotReadyError("the LoRA adapters of --lora-modules are still loading"))
        return error_json(async_llm.error and EngineDeadError(f"the engine failed: {async_llm.error!r}")
                          or _not_ready(async_llm))

    @app.get("/metrics")
    async def metrics_route():
        return Response(await metrics() if metrics is not None else stats.render(), media_type=stats.content_type)

    @app.post("/tokenize", openapi_extra=body_schema(P.TokenizeRequest))
    async def tokenize(raw: Request):
        body = await parse_body(raw, P.TokenizeRequest)
        serving.check_model(body.model)
        async_llm.check_usable()
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of `prompt` and `messages`", param="prompt")
        text = serving.tokenization
        if body.messages is not None:
            limits.check_template(body.chat_template)
            args = chat_template_args(body.add_generation_prompt, body.continue_final_message, body.chat_template,
                                      body.chat_template_kwargs, body.messages[-1].role if body.messages else None)
            if body.tools:
                args["tools"] = [t.model_dump(exclude_none=True) for t in body.tools]
            ids = await text.chat(body.messages, args, add_special_tokens=bool(body.add_special_tokens))
        else:
            ids = await text.encode(body.prompt, "prompt", add_special_tokens=body.add_special_tokens is not False)
        strs = text.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": async_llm.model_info().max_model_len, "tokens": ids,
                "token_strs": strs}

    @app.post("/detokenize", openapi_extra=body_schema(P.DetokenizeRequest))
    async def detokenize(raw: Request):
        body = await parse_body(raw, P.DetokenizeRequest)
        serving.check_model(body.model)
        async_llm.check_usable()
        if async_llm.tokenizer is None:
            raise APIError(400, "this server has no tokenizer (--skip-tokenizer-init): it cannot detokenize",
                           param="tokens")
        vocab = len(async_llm.tokenizer)
        bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the tokenizer's vocabulary [0, {vocab})", param="tokens")
        return {"prompt": await serving.tokenization.decode(body.tokens, skip_special_tokens=False)}

    @app.get("/version")
    async def version():
        return {"version": __version__}

    if config.enable_tokenizer_info_endpoint:
        @app.get("/tokenizer_info")
        async def tokenizer_info():
            async_llm.check_usable()
            return tokenizer_info_of(async_llm.tokenizer)

    @app.post("/v1/chat/completions/batch", openapi_extra=body_schema(P.BatchChatCompletionRequest))
    async def chat_completions_batch(raw: Request):
        return await batch.chat_batch(await parse_body(raw, P.BatchChatCompletionRequest), raw)

    @app.post("/v1/decisions", openapi_extra=body_schema(D.DecisionRequest))
    async def decide(raw: Request):
        return await decisions.decide(await parse_body(raw, D.DecisionRequest), raw)

    @app.post("/invocations", openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"anyOf": [{"$ref": f"#/components/schemas/{m.__name__}"}
                             for m in (P.ChatCompletionRequest, P.CompletionRequest)]}}}}})
    async def invocations(raw: Request):
        """SageMaker's route: a chat completion's body goes to chat, a completion's to completions (in that order,
        as vLLM)."""
        body = await parse_first(raw, (P.ChatCompletionRequest, P.CompletionRequest))
        if isinstance(body, P.ChatCompletionRequest):
            return await serving.chat(body, raw)
        return await serving.completions(body, raw)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping():  # SageMaker's health check
        return await health()

    @app.get("/load")
    async def load():
        return {"server_load": in_flight.value}

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            app.openapi_schema = add_schemas(doc, [P.CompletionRequest, P.ChatCompletionRequest,
                                                   P.TokenizeRequest, P.DetokenizeRequest,
                                                   P.BatchChatCompletionRequest, D.DecisionRequest,
                                                   P.LoadLoRAAdapterRequest, P.UnloadLoRAAdapterRequest])
        return app.openapi_schema

    app.openapi = openapi

    async def engine_load() -> dict[str, float]:
        return stats.load_report()

    app.add_middleware(OrcaLoadHeader, report=load_report or engine_load)
    if config.enable_server_load_tracking:
        app.add_middleware(ServerLoad, counter=in_flight)
    if config.enable_request_id_headers:
        app.add_middleware(RequestIdHeader)
    app.add_middleware(RequestGuard, api_keys=list(config.api_key) + list(_env_api_keys()),
                       max_body_bytes=config.max_body_bytes)
    return app


def _env_api_keys() -> tuple[str, ...]:
    from minivllm.envs import read_envs

    return read_envs().api_keys


def _not_ready(async_llm: EngineClient) -> Exception:
    try:
        async_llm.check_usable()
    except Exception as exc:
        return exc
    return RuntimeError("not ready")  # pragma: no cover


async def _watch_engine(app: FastAPI, async_llm: EngineClient, models: ServedModels) -> None:
    """Log when the engine is ready and load the ``--lora-modules`` adapters into it; when building or running it
    fails, or an adapter cannot be loaded, ask the server to exit."""
    try:
        await async_llm.wait_ready()
        await models.load_static()
        logger.info("engine ready: serving %s", app.state.served_model_name)
        error = await async_llm.wait_dead()
        logger.error("the engine failed: %r; the server exits", error)
    except EngineDeadError as exc:
        logger.error("%s", exc)
    except ValueError as exc:  # an adapter of --lora-modules: one line that names it, no traceback
        app.state.startup_error = exc
        logger.error("%s; the server exits", exc)
    if app.state.on_engine_failure is not None:
        app.state.on_engine_failure()


def run_server(model: str, engine_kwargs: dict, config: ServerConfig) -> int:
    """Serve one engine until SIGINT/SIGTERM; returns the exit code (0 after a graceful shutdown, 1 if the engine
    failed)."""
    import uvicorn

    name = config.served_model_name or model
    async_llm = AsyncLLM.from_model(model, max_num_waiting=config.max_num_waiting, **engine_kwargs)
    app = build_app(async_llm, name, config, lora_enabled=bool(engine_kwargs.get("enable_lora")))

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # stop accepting, and end the streams in flight now
            super().handle_exit(sig, frame)
            loop = app.state.loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(async_llm.begin_shutdown)

    # NOTE: the root path is FastAPI's alone (uvicorn's would prefix every path with it again): both
    # /v1/... and /<root path>/v1/... reach the routes, as in vLLM
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, uds=config.uds, log_level=config.log_level,
                               timeout_graceful_shutdown=10, access_log=config.log_level == "debug",
                               http=guarded_h11(config.request_timeout_s), timeout_keep_alive=config.timeout_keep_alive)
    server = Server(uv_config)
    app.state.on_engine_failure = lambda: setattr(server, "should_exit", True)
    # uvicorn re-raises the signal it caught once it is done; let that be a no-op so we exit 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    asyncio.run(server.serve())
    if async_llm.error is not None or app.state.startup_error is not None:
        return 1
    return 0
