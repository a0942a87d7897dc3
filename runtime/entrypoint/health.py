"""``/livez``, ``/readyz`` and ``/metrics`` (the startup stage timings) on the health port."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["HealthServer"]

_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}
_TEXT = "text/plain; charset=utf-8"


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
            try:
                request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            except asyncio.LimitOverrunError:
                # Over the stream's 64 KiB limit: no probe sends that, so answer and hang up.
                await self._respond(writer, 431, b"request too large\n", _TEXT, head_only=False)
                return
            method, path, _ = request.split(b" ", 2)
            status, body, kind = self._route(method.decode(), path.decode().split("?", 1)[0])
            await self._respond(writer, status, body, kind, head_only=method == b"HEAD")
        except (TimeoutError, asyncio.IncompleteReadError, ValueError, OSError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _respond(
        writer: asyncio.StreamWriter, status: int, body: bytes, kind: str, *, head_only: bool
    ) -> None:
        head = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode() + (b"" if head_only else body))
        await writer.drain()

    def _route(self, method: str, path: str) -> tuple[int, bytes, str]:
        if method not in ("GET", "HEAD"):
            return 405, b"method not allowed\n", _TEXT
        if path == "/livez":
            ok = self._live()
            return (200, b"ok\n", _TEXT) if ok else (503, b"not live\n", _TEXT)
        if path == "/readyz":
            ok = self._ready()
            return (200, b"ready\n", _TEXT) if ok else (503, b"not ready\n", _TEXT)
        if path == "/metrics":
            return 200, self._metrics(), "text/plain; version=0.0.4; charset=utf-8"
        return 404, b"not found\n", _TEXT
