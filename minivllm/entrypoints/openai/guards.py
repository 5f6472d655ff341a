"""What stands between a client and the handlers: the API key check, the body size cap, and the deadline for
a client to send its request.

``RequestGuard`` is ASGI middleware: a protected route without a valid ``Authorization: Bearer KEY`` gets 401,
a body over the cap 413, both in OpenAI's error shape and before anything is parsed. ``guarded_h11`` makes a
uvicorn h11 protocol that closes a connection whose request (headers, then body) has not fully arrived
within ``request_timeout_s`` of its first byte (or of the connection's opening): a client that sends half a
request cannot hold a connection open.
"""

from __future__ import annotations

import hmac
import json
import uuid

import h11
from starlette.exceptions import HTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

PROTECTED = ("/v1/", "/invocations", "/tokenize", "/detokenize")


def _error_body(message: str, type: str, code: str | None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type, "param": None, "code": code}}).encode()


async def _reply(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def route_path(scope) -> str:
    """The path the routes see: without ``--root-path``'s prefix when the request has it (``/llm/v1/models``
    and ``/v1/models`` are one route, as FastAPI routes them)."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("/", ""):
        return path[len(root):]
    return path


class RequestGuard:
    """ASGI middleware: API keys (compared in constant time) on the protected routes, and the body size cap."""

    def __init__(self, app, api_keys: list[str], max_body_bytes: int):
        self.app = app
        self.keys = [k.encode() for k in api_keys]
        self.max_body_bytes = max_body_bytes

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        value = next((v for k, v in headers if k == b"authorization"), b"")
        scheme, _, token = value.partition(b" ")
        ok = False
        for key in self.keys:  # NOTE: every key is compared, so the time does not tell which one is close
            ok |= hmac.compare_digest(token.strip(), key)
        return ok and scheme.lower() == b"bearer"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope["headers"]
        if self.keys and route_path(scope).startswith(PROTECTED) and not self._authorized(headers):
            body = _error_body("invalid or missing API key: send 'Authorization: Bearer <key>'",
                               "invalid_request_error", "invalid_api_key")
            return await _reply(send, 401, body, [(b"www-authenticate", b"Bearer")])
        length = next((v for k, v in headers if k == b"content-length"), None)
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            body = _error_body(f"the request body is larger than {self.max_body_bytes} bytes",
                               "invalid_request_error", "request_too_large")
            return await _reply(send, 413, body, [(b"connection", b"close")])
        await self.app(scope, self._capped(receive) if length is None else receive, send)

    def _capped(self, receive):
        """``receive`` for a body of unknown length: past the cap it raises (FastAPI answers 413)."""
        seen = 0

        async def capped():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise HTTPException(413, f"the request body is larger than {self.max_body_bytes} bytes")
            return message

        return capped


class _GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request to arrive (``request_timeout_s``, set by
    :func:`guarded_h11`)."""

    request_timeout_s = 30.0
    _deadline = None  # the pending close of a request that is too slow to arrive

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._deadline = self.loop.call_later(self.request_timeout_s, self._timed_out)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._receiving():
            if self._deadline is None:
                self._deadline = self.loop.call_later(self.request_timeout_s, self._timed_out)
        elif self.conn.their_state is not h11.IDLE:
            self._cancel_deadline()  # the whole request is here; the response may take its time

    def connection_lost(self, exc) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def _receiving(self) -> bool:
        """A request has begun to arrive and has not fully arrived."""
        state = self.conn.their_state
        return state is h11.SEND_BODY or (state is h11.IDLE and bool(self.conn.trailing_data[0]))

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or not (self._receiving() or self.conn.their_state is h11.IDLE):
            return
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:  # headers never completed
            body = _error_body(f"the request did not arrive within {self.request_timeout_s:g} s",
                               "invalid_request_error", "request_timeout")
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                 b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
                                 + body)
        self.transport.close()


def guarded_h11(request_timeout_s: float) -> type[H11Protocol]:
    """An h11 protocol class for ``uvicorn.Config(http=...)`` with this request deadline."""
    return type("GuardedH11Protocol", (_GuardedH11Protocol,), {"request_timeout_s": request_timeout_s})


class RequestIdHeader:
    """ASGI middleware (``--enable-request-id-headers``): each response carries the request's ``X-Request-Id``,
    or a new one when the request had none."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = next((v for k, v in scope["headers"] if k == b"x-request-id"), None) or uuid.uuid4().hex.encode()

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
