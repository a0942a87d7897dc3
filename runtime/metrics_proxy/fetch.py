"""A keep-alive HTTP/1.1 GET of one URL over asyncio, parsed by ``httptools``, bounded in time
and size; the proxy's Triton fetch, which a general client (httpx) made several times slower.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import httptools

__all__ = ["FetchError", "Fetcher"]

_IDLE_KEPT = 2


class FetchError(Exception):
    """The GET failed; ``reason`` is one of connect, timeout, http_status, too_large, parse."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Connection(asyncio.Protocol):
    """One TCP connection answering one request at a time."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        # uvloop's transports do not subclass asyncio.Transport, hence the base class here.
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.answered = False  # a byte of the current response arrived
        self.body: list[bytes] = []
        self.size = 0
        self.until_eof = True
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(FetchError("parse", f"malformed HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            status = self.parser.get_status_code() if self.answered else 0
            if status and self.until_eof:  # a body delimited by the end of the connection
                self.waiter.set_result((status, b"".join(self.body)))
            else:
                self.waiter.set_exception(FetchError("connect", f"connection closed: {exc!r}"))

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.until_eof = False

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.max_bytes:
            self._fail(FetchError("too_large", f"response over {self.max_bytes} bytes"))
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((self.parser.get_status_code(), b"".join(self.body)))
        if not self.parser.should_keep_alive():
            self.close()

    def _fail(self, error: FetchError) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)
        self.close()

    def request(self, data: bytes) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.answered, self.body, self.size, self.until_eof = False, [], 0, True
        self.transport.write(data)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Fetcher:
    """GETs ``url`` (plain ``http://`` only), reusing idle connections between calls."""

    def __init__(self, url: str, max_bytes: int) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url!r}: only http://host[:port]/path URLs are supported")
        self.url = url
        self._host = parts.hostname
        self._port = parts.port or 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        host = parts.netloc.rsplit("@", 1)[-1]
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/plain\r\n"
            "Accept-Encoding: identity\r\nUser-Agent: llm-serving-metrics-proxy\r\n\r\n"
        ).encode("latin-1")
        self._max_bytes = max_bytes
        self._idle: list[_Connection] = []

    async def get(self, timeout_s: float) -> bytes:
        """The body of a 200 answer within ``timeout_s`` overall; raises ``FetchError``."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self._get()
        except TimeoutError as exc:
            raise FetchError("timeout", f"{self.url} did not answer within {timeout_s} s") from exc

    async def _get(self) -> bytes:
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(conn)
            except FetchError as exc:
                # A kept-alive connection the server closed meanwhile: retry on a new one.
                if exc.reason != "connect" or conn.answered:
                    raise
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(
                lambda: _Connection(self._max_bytes), self._host, self._port
            )
        except OSError as exc:
            raise FetchError("connect", f"{self.url}: {exc!r}") from exc
        return await self._exchange(conn)

    async def _exchange(self, conn: _Connection) -> bytes:
        try:
            status, body = await conn.request(self._request)
        except BaseException:
            conn.close()  # cancelled or failed mid-response: the connection's state is unknown
            raise
        if not conn.closed and len(self._idle) < _IDLE_KEPT:
            self._idle.append(conn)
        elif not conn.closed:
            conn.close()
        if status != 200:
            raise FetchError("http_status", f"{self.url} answered {status}")
        return body

    def close(self) -> None:
        """Close the idle connections."""
        for conn in self._idle:
            conn.close()
        self._idle.clear()
