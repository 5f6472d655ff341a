"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

from __future__ import annotations

import logging

from minivllm.engine.async_engine import EngineDeadError, EngineNotReadyError
from minivllm.entrypoints import protocol as P

logger = logging.getLogger(__name__)


class APIError(Exception):
    """An error the client gets as ``{"error": {...}}`` with this HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: int | str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def error_response(exc: Exception) -> tuple[int, dict]:
    """``(status, {"error": {...}})`` for an exception, in OpenAI's shape."""
    if isinstance(exc, APIError):
        status, info = exc.status, P.ErrorInfo(message=exc.message, type=exc.type, param=exc.param, code=exc.code)
    elif isinstance(exc, ValueError):
        word = str(exc).split(" ", 1)[0]
        param = word if word in P.CompletionRequest.model_fields or word in P.ChatCompletionRequest.model_fields \
            else None
        status, info = 400, P.ErrorInfo(message=str(exc), type="invalid_request_error", param=param)
    elif isinstance(exc, EngineNotReadyError):
        status, info = 503, P.ErrorInfo(message=str(exc), type="service_unavailable", code="engine_not_ready")
    elif isinstance(exc, EngineDeadError):
        status, info = 503, P.ErrorInfo(message=str(exc), type="service_unavailable", code="engine_dead")
    else:
        logger.error("internal error", exc_info=exc)
        status, info = 500, P.ErrorInfo(message=f"internal server error: {type(exc).__name__}: {exc}",
                                        type="server_error")
    return status, P.ErrorResponse(error=info).model_dump()
