"""``/livez``, ``/readyz`` and ``/metrics`` (the startup stage timings) on the health port."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["HealthServer"]

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class HealthServer:
    """A tiny HTTP/1.1 server on the event loop: probes must answer even while a stage runs."""

    def __init__(
        self,
        host: str,
        port: int,
        live: Callable[[], bool],
        ready: Callable[[], bool],
        metrics: Callable[[], bytes],
    ) -> None:
        self.host, self.port = host, port
        self._live, self._ready, self._metrics = live, ready, metrics
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        """Bind and serve in the background."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]

    def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            method, path, _ = request.split(b" ", 2)
            status, body, kind = self._route(method.decode(), path.decode().split("?", 1)[0])
            head = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (body if method != b"HEAD" else b""))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ValueError, OSError):
            pass
        finally:
            writer.close()

    def _route(self, method: str, path: str) -> tuple[int, bytes, str]:
        text = "text/plain; charset=utf-8"
        if method not in ("GET", "HEAD"):
            return 405, b"method not allowed\n", text
        if path == "/livez":
            ok = self._live()
            return (200, b"ok\n", text) if ok else (503, b"not live\n", text)
        if path == "/readyz":
            ok = self._ready()
            return (200, b"ready\n", text) if ok else (503, b"not ready\n", text)
        if path == "/metrics":
            return 200, self._metrics(), "text/plain; version=0.0.4; charset=utf-8"
        return 404, b"not found\n", text
