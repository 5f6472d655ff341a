"""What the server tells load balancers about its load, as vLLM does: the requests in flight (``GET /load``, with
``--enable-server-load-tracking``) and the ORCA load report (the ``endpoint-load-metrics`` response header, when a
request asks for it with ``endpoint-load-metrics-format: TEXT`` or ``JSON``).

Both are ASGI middleware, so every route they cover (completions and chat, the batch route, SageMaker's
``/invocations``) gets them without a line of its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

#: the routes that run the model: the ones ``/load`` counts (vLLM's, of those this server has)
GENERATING = ("/v1/completions", "/v1/chat/completions", "/v1/chat/completions/batch", "/v1/decisions",
              "/invocations")
#: the routes whose whole (not streamed) answers carry the ORCA header, as in vLLM
ORCA_ROUTES = ("/v1/completions", "/v1/chat/completions", "/invocations")
ORCA_REQUEST_HEADER = b"endpoint-load-metrics-format"


def _route(scope) -> str:
    """The request's path within the app (without the ``--root-path`` prefix a proxy may have left on it)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class LoadCounter:
    """The requests in flight on the generating routes: ``GET /load``'s ``server_load`` (changed on the event
    loop's thread alone)."""

    def __init__(self):
        self.value = 0


class ServerLoad:
    """ASGI middleware: counts each request to the generating routes in ``counter`` from its arrival until its
    response (a whole stream included) is sent, or its client is gone."""

    def __init__(self, app, counter: LoadCounter):
        self.app, self.counter = app, counter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or _route(scope) not in GENERATING:
            return await self.app(scope, receive, send)
        self.counter.value += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.counter.value -= 1


def orca_header(fmt: str, named_metrics: dict[str, float]) -> str | None:
    """The ``endpoint-load-metrics`` header value in ``fmt`` (TEXT or JSON, any case), None for another format:
    ``TEXT named_metrics.kv_cache_usage_perc=0.25, named_metrics.num_requests_waiting=0.0`` or ``JSON
    {"named_metrics": {...}}`` (vLLM's forms of the ORCA load report)."""
    if fmt.lower() == "text":
        return "TEXT " + ", ".join(f"named_metrics.{name}={value}" for name, value in named_metrics.items())
    if fmt.lower() == "json":
        return "JSON " + json.dumps({"named_metrics": named_metrics})
    return None


class OrcaLoadHeader:
    """ASGI middleware: a whole (JSON, 200) answer of the ORCA routes to a request with an
    ``endpoint-load-metrics-format`` header carries ``endpoint-load-metrics``, the load report of ``report()`` in
    that format; an unknown format gets no header (and a warning in the log), as in vLLM."""

    def __init__(self, app, report: Callable[[], Awaitable[dict[str, float]]]):
        self.app, self.report = app, report

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or _route(scope) not in ORCA_ROUTES:
            return await self.app(scope, receive, send)
        fmt = next((v for k, v in scope["headers"] if k == ORCA_REQUEST_HEADER), None)
        if not fmt:
            return await self.app(scope, receive, send)

        async def send_with_report(message):
            if message["type"] == "http.response.start" and message["status"] == 200 and any(
                    k == b"content-type" and v.startswith(b"application/json") for k, v in message.get("headers", [])):
                value = orca_header(fmt.decode("latin-1"), await self.report())
                if value is None:
                    logger.warning("endpoint-load-metrics-format %r is not TEXT or JSON: no load report", fmt)
                else:
                    message = {**message, "headers": [*message["headers"],
                                                      (b"endpoint-load-metrics", value.encode("latin-1"))]}
            await send(message)

        await self.app(scope, receive, send_with_report)
