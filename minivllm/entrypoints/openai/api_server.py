"""The OpenAI-compatible HTTP server: a FastAPI app on an AsyncLLM, run by uvicorn.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /metrics``, ``POST /tokenize``, ``POST /detokenize``. Every error is
answered in OpenAI's ``{"error": {...}}`` shape (400 for bad input, pydantic's included).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from minivllm.engine.async_engine import AsyncLLM, EngineDeadError, EngineNotReadyError
from minivllm.entrypoints.openai import protocol as P
from minivllm.entrypoints.openai.errors import APIError, error_response
from minivllm.entrypoints.openai.metrics import PrometheusStatLogger
from minivllm.entrypoints.openai.serving import OpenAIServing

logger = logging.getLogger("minivllm.server")


def _error(exc: Exception) -> JSONResponse:
    status, body = error_response(exc)
    return JSONResponse(body, status_code=status)


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return _error(APIError(400, f"the request body is not valid JSON: {errors[0].get('ctx', {}).get('error', '')}"
                               .rstrip(": ")))

    def where(e) -> str:
        return ".".join(str(x) for x in e.get("loc", ()) if x != "body")

    msg = "; ".join(f"{where(e) or 'body'}: {e.get('msg')}" for e in errors[:5])
    return _error(APIError(400, msg or "invalid request", param=(where(errors[0]) or None) if errors else None))


def build_app(async_llm: AsyncLLM, served_model_name: str) -> FastAPI:
    """The FastAPI app; its lifespan starts the engine loop and shuts it down."""
    stats = PrometheusStatLogger(served_model_name)
    async_llm.stat_loggers.append(stats)
    serving = OpenAIServing(async_llm, served_model_name)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_llm.start()
        watcher = asyncio.create_task(_watch_startup(app, async_llm))
        yield
        watcher.cancel()
        await async_llm.shutdown()

    app = FastAPI(title="minivllm", lifespan=lifespan)
    app.state.async_llm, app.state.stats, app.state.served_model_name = async_llm, stats, served_model_name
    app.state.on_startup_failure = None

    async def on_validation_error(request: Request, exc: RequestValidationError):
        return _validation_error(exc)

    async def on_http_error(request: Request, exc: StarletteHTTPException):
        return _error(APIError(exc.status_code, str(exc.detail)))

    async def on_error(request: Request, exc: Exception):
        return _error(exc)

    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    for cls in (APIError, ValueError, EngineNotReadyError, EngineDeadError, Exception):
        app.add_exception_handler(cls, on_error)

    @app.post("/v1/completions")
    async def completions(body: P.CompletionRequest, raw: Request):
        return await serving.completions(body, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: P.ChatCompletionRequest, raw: Request):
        return await serving.chat(body, raw)

    @app.get("/v1/models")
    async def models():
        card = {"id": served_model_name, "object": "model", "created": created, "owned_by": "minivllm"}
        if async_llm.is_ready:
            card["max_model_len"] = async_llm.max_model_len
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health():
        if async_llm.is_ready:
            return Response(status_code=200)
        return _error(async_llm.error and EngineDeadError(f"the engine failed: {async_llm.error!r}")
                      or _not_ready(async_llm))

    @app.get("/metrics")
    async def metrics():
        return Response(stats.render(), media_type=stats.content_type)

    @app.post("/tokenize")
    async def tokenize(body: P.TokenizeRequest):
        serving.check_model(body.model)
        async_llm.check_usable()
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of `prompt` and `messages`", param="prompt")
        tok = async_llm.tokenizer
        if body.messages is not None:
            ids = serving.chat_prompt(body.messages, body.add_generation_prompt)
        else:
            ids = tok.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        strs = tok.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": async_llm.max_model_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(body: P.DetokenizeRequest):
        serving.check_model(body.model)
        async_llm.check_usable()
        vocab = len(async_llm.tokenizer)
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the tokenizer's vocabulary [0, {vocab})",
                           param="tokens")
        return {"prompt": async_llm.decode(body.tokens, skip_special_tokens=False)}

    return app


def _not_ready(async_llm: AsyncLLM) -> Exception:
    try:
        async_llm.check_usable()
    except Exception as exc:
        return exc
    return RuntimeError("not ready")  # pragma: no cover


async def _watch_startup(app: FastAPI, async_llm: AsyncLLM) -> None:
    """Log when the engine is ready; if building it failed, ask the server to exit."""
    try:
        await async_llm.wait_ready()
    except EngineDeadError as exc:
        logger.error("%s", exc)
        if app.state.on_startup_failure is not None:
            app.state.on_startup_failure()
        return
    logger.info("engine ready: serving %s", app.state.served_model_name)


def run_server(args) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit code (0 after a graceful shutdown)."""
    import uvicorn

    from minivllm.entrypoints.args import engine_kwargs

    name = args.served_model_name or args.model
    async_llm = AsyncLLM.from_model(args.model, **engine_kwargs(args))
    app = build_app(async_llm, name)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # stop accepting, and end the streams in flight now
            super().handle_exit(sig, frame)
            loop = async_llm._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(async_llm.begin_shutdown)

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=10, access_log=args.log_level == "debug")
    server = Server(config)
    app.state.on_startup_failure = lambda: setattr(server, "should_exit", True)
    # uvicorn re-raises the signal it caught once it is done; let that be a no-op so we exit 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    asyncio.run(server.serve())
    if async_llm.error is not None:
        return 1
    return 0
