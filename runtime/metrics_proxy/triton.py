"""Fetches Triton's ``/metrics`` over HTTP with a bounded time and size; parses its text.

The proxy parses with the native ``_metrics.TextParser``; ``parse_text_exposition`` is the
reference it is tested against.
"""

from __future__ import annotations

import asyncio
import re
from urllib.parse import urlsplit

from runtime.metrics_proxy.exposition import Family, LabelSet, Sample

__all__ = ["SeriesCache", "TritonClient", "TritonScrapeError", "parse_text_exposition"]

_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\})')
_UNESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


class TritonScrapeError(Exception):
    """Triton's metrics could not be read; ``reason`` is the error counter's label value."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _UNESCAPE.sub(lambda m: _UNESCAPED.get(m.group(1), "\\" + m.group(1)), value)


SeriesCache = dict[str, tuple[str, LabelSet]]
"""Parsed ``name{labels}`` text by its raw form: the same on every scrape of one Triton."""
_SERIES_CACHE_LIMIT = 50_000


def _parse_series(line: str, lineno: int) -> tuple[str, LabelSet, int]:
    brace = line.find("{")
    name = line[:brace]
    labels: list[tuple[str, str]] = []
    pos = brace + 1
    if line[pos : pos + 1] == "}":
        return name, (), pos + 1
    while True:
        match = _LABEL.match(line, pos)
        if match is None:
            raise TritonScrapeError("parse", f"line {lineno}: bad labels in {line!r}")
        labels.append((match.group(1), _unescape(match.group(2))))
        pos = match.end()
        if match.group(3) == "}":
            return name, tuple(labels), pos


def _parse_sample(line: str, lineno: int, cache: SeriesCache) -> Sample:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        # The value and timestamp never hold a brace, so the last one closes the labels.
        end = line.rfind("}") + 1
        series = line[:end]
        parsed = cache.get(series)
        if parsed is None:
            name, labels, stop = _parse_series(line, lineno)
            if stop != end:
                raise TritonScrapeError("parse", f"line {lineno}: bad labels in {line!r}")
            if len(cache) >= _SERIES_CACHE_LIMIT:
                cache.clear()
            parsed = cache[series] = (name, labels)
        name, labels = parsed
        rest = line[end:].split()
    else:
        name, *rest = line.split()
        labels = ()
    if not name or not rest:
        raise TritonScrapeError("parse", f"line {lineno}: no value in {line!r}")
    try:
        value = float(rest[0])
    except ValueError as exc:
        raise TritonScrapeError("parse", f"line {lineno}: bad value in {line!r}") from exc
    return Sample(name, labels, value)


def _base_name(declared: str, typ: str) -> str:
    if typ == "counter" and declared.endswith("_total"):
        return declared[: -len("_total")]
    return declared


def parse_text_exposition(text: str, cache: SeriesCache | None = None) -> list[Family]:
    """Parse Prometheus text format 0.0.4; raises ``TritonScrapeError`` on a malformed line.

    Pass the same ``cache`` on every scrape of one endpoint to skip re-parsing its labels.
    """
    cache = {} if cache is None else cache
    families: dict[str, Family] = {}
    declared: dict[str, tuple[str, str]] = {}  # declared name -> (type, help)
    current: Family | None = None
    # Only "\n" ends a line: label values and help may hold "\r" or U+2028 raw, which
    # str.splitlines() would split on.
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.lstrip(" \t")
        if not line.strip(" \t\r"):
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                typ, help_text = declared.get(parts[2], ("untyped", ""))
                rest = parts[3] if len(parts) > 3 else ""
                if parts[1] == "HELP":
                    help_text = _unescape(rest)
                else:
                    typ = rest.strip() or "untyped"
                declared[parts[2]] = (typ, help_text)
            continue
        sample = _parse_sample(line, lineno, cache)
        if current is None or not (
            sample.name == current.name
            or (
                sample.name.startswith(current.name)
                and sample.name[len(current.name) :] in _SUFFIXES
            )
        ):
            current = _family_for(sample.name, declared, families)
        current.samples.append(sample)
    return list(families.values())


def _family_for(
    sample_name: str, declared: dict[str, tuple[str, str]], families: dict[str, Family]
) -> Family:
    candidates = [sample_name] + [
        sample_name[: -len(s)] for s in _SUFFIXES if sample_name.endswith(s)
    ]
    for name in candidates:
        if name in declared:
            typ, help_text = declared[name]
            base = _base_name(name, typ)
            break
    else:
        typ, help_text, base = "untyped", "", sample_name
    family = families.get(base)
    if family is None:
        family = families[base] = Family(base, typ, help_text)
    return family


_CLOSED_IDLE = "closed before a response"


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to Triton: sends a GET and collects one response."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self._buffer = bytearray()
        self._waiter: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._check()

    def eof_received(self) -> bool:
        self.closed = True
        self._check()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._check()

    def request(self, data: bytes) -> asyncio.Future[bytes]:
        assert self.transport is not None
        self._buffer.clear()
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self._waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _check(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        try:
            body = self._parse()
        except TritonScrapeError as exc:
            waiter.set_exception(exc)
            return
        if body is not None:
            waiter.set_result(body)
        elif self.closed:
            message = _CLOSED_IDLE if not self._buffer else "closed mid-response"
            waiter.set_exception(TritonScrapeError("connect", message))

    def _parse(self) -> bytes | None:
        """The body once the response is complete; None while more is needed."""
        buf = self._buffer
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > self.max_bytes:
                raise TritonScrapeError("too_large", f"sent over {self.max_bytes} bytes")
            return None
        head = bytes(buf[:end]).decode("latin-1").split("\r\n")
        status_line = head[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/"):
            raise TritonScrapeError("connect", f"not an HTTP response: {head[0]!r}")
        try:
            status = int(status_line[1])
        except ValueError as exc:
            raise TritonScrapeError("connect", f"bad status line {head[0]!r}") from exc
        headers: dict[str, str] = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if status != 200:
            raise TritonScrapeError("http_status", f"answered {status}")
        start = end + 4
        keep_alive = status_line[0] == "HTTP/1.1" and headers.get("connection", "") != "close"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._dechunk(start)
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError as exc:
                raise TritonScrapeError("connect", "bad Content-Length") from exc
            if length > self.max_bytes:
                raise TritonScrapeError("too_large", f"sent over {self.max_bytes} bytes")
            if len(buf) - start < length:
                return None
            body = bytes(buf[start : start + length])
        else:  # the body runs to the end of the connection
            keep_alive = False
            if len(buf) - start > self.max_bytes:
                raise TritonScrapeError("too_large", f"sent over {self.max_bytes} bytes")
            if not self.closed:
                return None
            body = bytes(buf[start:])
        self.reusable = keep_alive and not self.closed
        return body

    def _dechunk(self, pos: int) -> bytes | None:
        buf, parts, size = self._buffer, [], 0
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return None
            try:
                length = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
            except ValueError as exc:
                raise TritonScrapeError("connect", "bad chunk size") from exc
            size += length
            if size > self.max_bytes:
                raise TritonScrapeError("too_large", f"sent over {self.max_bytes} bytes")
            if length == 0:
                # Trailers (rarely any) end with an empty line.
                return b"".join(parts) if buf.find(b"\r\n\r\n", eol) >= 0 else None
            if len(buf) < eol + 2 + length + 2:
                return None
            parts.append(bytes(buf[eol + 2 : eol + 2 + length]))
            pos = eol + 2 + length + 2


class TritonClient:
    """GETs Triton's metrics over kept-alive HTTP/1.1, within a bounded time and size.

    Plain HTTP only (Triton's port 8002 is on loopback), and never through a pod-wide
    ``HTTP(S)_PROXY``: the environment is not read. A connection closed while idle is
    replaced once, as any pooling client does.
    """

    def __init__(self, url: str, timeout_s: float, max_bytes: int) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"Triton's metrics URL must be http://host[:port]/path, got {url!r}")
        self.url = url
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._host, self._port = parts.hostname, parts.port or 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            "Accept: text/plain\r\nUser-Agent: llm-serving-metrics-proxy\r\n\r\n"
        ).encode("latin-1")
        self._idle: list[_Connection] = []

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: _Connection(self.max_bytes), self._host, self._port
        )
        return conn

    async def _get(self) -> bytes:
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(conn)
            except TritonScrapeError as exc:
                if str(exc) != _CLOSED_IDLE:
                    raise
                # The server closed it while idle: take another or a fresh one.
        return await self._exchange(await self._connect())

    async def _exchange(self, conn: _Connection) -> bytes:
        try:
            body = await conn.request(self._request)
        except BaseException:  # an error, the timeout's cancellation: never reused
            conn.close()
            raise
        if conn.reusable and len(self._idle) < 2:
            self._idle.append(conn)
        else:
            conn.close()
        return body

    async def fetch(self) -> bytes:
        """The body of one GET; raises ``TritonScrapeError`` with the error counter's reason."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._get()
        except TimeoutError as exc:
            raise TritonScrapeError(
                "timeout", f"{self.url} did not answer within {self.timeout_s} s"
            ) from exc
        except TritonScrapeError as exc:
            raise TritonScrapeError(exc.reason, f"{self.url}: {exc}") from exc
        except OSError as exc:
            raise TritonScrapeError("connect", f"{self.url}: {exc!r}") from exc

    def close(self) -> None:
        """Close the idle connections."""
        for conn in self._idle:
            conn.close()
        self._idle.clear()
