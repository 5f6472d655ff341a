"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

from __future__ import annotations

import logging

from fastapi.responses import JSONResponse

from minivllm.engine.protocol import EngineDeadError, EngineNotReadyError, EngineOverloadedError
from minivllm.entrypoints.openai import protocol as P

logger = logging.getLogger(__name__)


class APIError(Exception):
    """An error the client gets as ``{"error": {...}}`` with this HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: int | str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}


def as_api_error(exc: Exception) -> APIError:
    """The client's view of an exception: bad input is a 400 naming the field (a ``ParameterError``'s, or the
    message's first word when it is one), an engine that is loading or gone a 503, anything else a 500 (logged)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValueError):
        param = getattr(exc, "parameter", None)
        if param is None:
            word = str(exc).split(" ", 1)[0]
            fields = P.CompletionRequest.model_fields.keys() | P.ChatCompletionRequest.model_fields.keys()
            param = word if word in fields else None
        return APIError(400, str(exc), param=param)
    if isinstance(exc, EngineNotReadyError):
        return APIError(503, str(exc), "service_unavailable", code="engine_not_ready")
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc), "service_unavailable", code="engine_dead")
    if isinstance(exc, EngineOverloadedError):
        return APIError(429, str(exc), "rate_limit_error", code="too_many_waiting_requests",
                        headers={"Retry-After": "1"})
    logger.error("internal error", exc_info=exc)
    return APIError(500, f"internal server error: {type(exc).__name__}: {exc}", "server_error")


def error_response(exc: Exception) -> tuple[int, dict]:
    """``(status, {"error": {"message", "type", "param", "code"}})`` for an exception, in OpenAI's shape."""
    err = as_api_error(exc)
    return err.status, {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}


def error_json(exc: Exception) -> JSONResponse:
    """The HTTP response of an exception (its status, OpenAI's error body, and any headers such as Retry-After)."""
    err = as_api_error(exc)
    status, body = error_response(err)
    return JSONResponse(body, status_code=status, headers=err.headers)
