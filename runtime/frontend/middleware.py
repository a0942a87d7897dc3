"""ASGI middleware: the request-size limit and structured access logs (never prompt text)."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.frontend.errors import RequestTooLargeError, error_body

__all__ = ["ACCESS_LOGGER", "AccessLogMiddleware", "BodyLimitMiddleware"]

ACCESS_LOGGER = "runtime.frontend.access"


class BodyLimitMiddleware:
    """Refuse bodies over ``limit`` bytes: by Content-Length, or by reading a chunked body."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        if declared is not None:
            await self.app(scope, receive, send)
            return
        # Chunked body: read it (up to the limit) before the app sees any of it.
        buffered: list[Message] = []
        seen = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)

    def _error(self) -> RequestTooLargeError:
        return RequestTooLargeError(
            f"request body exceeds {self.limit} bytes (LLM_SERVING_FRONTEND_MAX_REQUEST_BYTES)",
            code="request_too_large",
        )

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(error_body(self._error())).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


#: An ``X-Request-Id`` taken as sent (a gateway's UUID, a client's trace id); any other value
#: is replaced, so a log line cannot be forged or bloated through it.
_CLIENT_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


def _request_id(scope: Scope) -> str:
    """The request's ``X-Request-Id`` if it has a plain one, else a new id."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id" and _CLIENT_REQUEST_ID.fullmatch(value):
            return value.decode("ascii")
    return uuid.uuid4().hex


class AccessLogMiddleware:
    """One JSON line per request: method, path, status, duration, sizes, and the request id,
    the caller's ``X-Request-Id`` (as Envoy and other gateways set it) or a new one, echoed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.log = logging.getLogger(ACCESS_LOGGER)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = _request_id(scope)
        record: dict[str, Any] = {
            "event": "access",
            "request_id": request_id,
            "method": scope["method"],
            "path": scope["path"],
            "client": (scope.get("client") or ("", 0))[0],
            "status": 0,
            "bytes_in": 0,
            "bytes_out": 0,
        }

        async def counting_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                record["bytes_in"] += len(message.get("body", b""))
            return message

        async def logging_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                record["status"] = message["status"]
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", request_id.encode()),
                ]
            elif message["type"] == "http.response.body":
                record["bytes_out"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counting_receive, logging_send)
        finally:
            record["duration_ms"] = round((time.perf_counter() - start) * 1000, 3)
            self.log.info(json.dumps(record, separators=(",", ":")))
