"""The proxy's ASGI application: ``GET /metrics`` merges the sources, ``GET /healthz`` answers."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from runtime.metrics_proxy import _metrics
from runtime.metrics_proxy.exposition import Family, Sample, negotiate, wants_gzip
from runtime.metrics_proxy.multiproc import mark_dead_processes
from runtime.metrics_proxy.settings import ProxySettings
from runtime.metrics_proxy.triton import TritonClient, TritonScrapeError

__all__ = ["ERROR_REASONS", "MetricsProxyApp", "ProxyConfigError", "create_app"]

log = logging.getLogger(__name__)

TRITON, VLLM = "triton", "vllm"
ERROR_REASONS = {
    TRITON: ("connect", "timeout", "http_status", "too_large", "parse", "internal"),
    VLLM: ("read_dir", "corrupt_file", "internal"),
}
"""Error counter label values per source, exposed at 0 from the start so rate() works."""


class ProxyConfigError(ValueError):
    """The proxy's environment is unusable; the message names the variable to set."""


@dataclass
class _Collected:
    """One merge of the sources, shared by the scrapes that waited for it; bodies cached.

    The merge's first body is written while it is collected; another format is written from
    the same families when a scrape asks for it.
    """

    encoder: _metrics.Encoder
    layout: _metrics.FamilyList
    own: _metrics.FamilyList
    sources: list[_metrics.FamilyList]
    bodies: dict[tuple[bool, bool], bytes] = field(default_factory=dict)

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        key = (openmetrics, gzipped)
        body = self.bodies.get(key)
        if body is None:
            writer = _metrics.BodyWriter(self.encoder, openmetrics, gzipped)
            writer.reserve(self.layout)
            for source in self.sources:
                writer.add(source)
            writer.add_reserved(self.own)
            body = self.bodies[key] = writer.finish()
        return body


@dataclass
class _SourceState:
    up: bool = False
    duration_s: float = 0.0
    errors: dict[str, float] = field(default_factory=dict)
    last_error: str = ""


class MetricsProxyApp:
    """ASGI app holding the HTTP client, the multiprocess reader and per-source health."""

    def __init__(self, settings: ProxySettings) -> None:
        if settings.multiproc_dir is None:
            raise ProxyConfigError(
                "PROMETHEUS_MULTIPROC_DIR is not set: point it (or METRICS_PROXY_MULTIPROC_DIR) "
                "at the directory vLLM writes its multiprocess metrics to"
            )
        self.settings = settings
        self._encoder = _metrics.Encoder(list(settings.constant_labels()))
        self._parser = _metrics.TextParser()
        self._reader = _metrics.MultiprocReader(str(settings.multiproc_dir))
        self._client: TritonClient | None = None
        self._inflight: asyncio.Future[_Collected] | None = None
        self._state = {
            source: _SourceState(errors=dict.fromkeys(reasons, 0.0))
            for source, reasons in ERROR_REASONS.items()
        }
        self._finished_at = 0.0
        self._corrupt_seen: tuple[str, ...] = ()
        self._files = 0
        self._corrupt = 0
        self._dropped = 0
        # Names are all that reserve() reads: the proxy's own families hide any source's.
        self._own_layout = _metrics.FamilyList.of(self._own_families())

    async def startup(self) -> None:
        """Create the keep-alive client used for every Triton fetch."""
        try:
            self._client = TritonClient(
                self.settings.triton_url,
                self.settings.triton_timeout_s,
                self.settings.triton_max_bytes,
            )
        except ValueError as exc:
            raise ProxyConfigError(f"METRICS_PROXY_TRITON_URL: {exc}") from exc

    async def shutdown(self) -> None:
        """Close the client's connections."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def _fail(self, source: str, reason: str, message: str) -> None:
        state = self._state[source]
        state.errors[reason] = state.errors.get(reason, 0.0) + 1
        if state.up or message != state.last_error:
            log.warning("metrics source %s failed (%s): %s", source, reason, message)
        state.up, state.last_error = False, message

    async def _scrape_triton(self) -> _metrics.FamilyList | None:
        assert self._client is not None, "startup() not run"
        start = time.perf_counter()
        state = self._state[TRITON]
        families = None
        try:
            body = await self._client.fetch()
            try:
                families = self._parser.parse(body)
            except ValueError as exc:
                raise TritonScrapeError("parse", f"{self.settings.triton_url}: {exc}") from exc
        except TritonScrapeError as exc:
            self._fail(TRITON, exc.reason, str(exc))
        except Exception as exc:  # a bug must cost the source, never the whole scrape
            log.exception("reading Triton's metrics failed unexpectedly")
            self._fail(TRITON, "internal", repr(exc))
        else:
            state.up, state.last_error = True, ""
        state.duration_s = time.perf_counter() - start
        return families

    def _read_vllm(self, writer: _metrics.BodyWriter) -> _metrics.FamilyList | None:
        """Read the .db files and write (and compress) them into ``writer``, without the GIL."""
        start = time.perf_counter()
        state = self._state[VLLM]
        result = None
        try:
            if self.settings.mark_dead_processes:
                mark_dead_processes(self.settings.multiproc_dir)  # type: ignore[arg-type]
            result = self._reader.read_into(writer)
        except OSError as exc:
            self._fail(VLLM, "read_dir", f"{self.settings.multiproc_dir}: {exc}")
            self._files = self._corrupt = 0
        except Exception as exc:  # a bug must cost the source, never the whole scrape
            log.exception("reading the multiprocess files failed unexpectedly")
            self._fail(VLLM, "internal", repr(exc))
            self._files = self._corrupt = 0
        else:
            corrupt = result.corrupt_files
            self._files, self._corrupt = result.files, len(corrupt)
            state.up, state.last_error = True, ""
            state.errors["corrupt_file"] += len(corrupt)
            if corrupt != self._corrupt_seen:  # log changes, not every scrape
                self._corrupt_seen = corrupt
                if corrupt:
                    log.warning("skipping corrupt files: %s", "; ".join(corrupt))
        state.duration_s = time.perf_counter() - start
        return result

    def _own_families(self) -> list[Family]:
        def gauge(name: str, help_text: str, samples: list[Sample]) -> Family:
            return Family(name, "gauge", help_text, samples)

        st = self._state
        return [
            gauge(
                "metrics_proxy_source_up",
                "1 if the source was read in the last scrape, 0 if not.",
                [Sample("metrics_proxy_source_up", (("source", s),), float(st[s].up)) for s in st],
            ),
            gauge(
                "metrics_proxy_source_scrape_duration_seconds",
                "Time the last scrape spent reading the source.",
                [
                    Sample(
                        "metrics_proxy_source_scrape_duration_seconds",
                        (("source", s),),
                        st[s].duration_s,
                    )
                    for s in st
                ],
            ),
            Family(
                "metrics_proxy_source_errors",
                "counter",
                "Failed reads of a source (corrupt_file: per skipped file), by reason.",
                [
                    Sample("metrics_proxy_source_errors_total", (("source", s), ("reason", r)), v)
                    for s in st
                    for r, v in st[s].errors.items()
                ],
            ),
            gauge(
                "metrics_proxy_multiproc_files",
                "Multiprocess .db files merged in the last scrape.",
                [Sample("metrics_proxy_multiproc_files", (), float(self._files))],
            ),
            gauge(
                "metrics_proxy_multiproc_corrupt_files",
                "Multiprocess .db files skipped as truncated or corrupt in the last scrape.",
                [Sample("metrics_proxy_multiproc_corrupt_files", (), float(self._corrupt))],
            ),
            gauge(
                "metrics_proxy_duplicate_families",
                "Triton families hidden because vLLM's multiprocess files carry them complete.",
                [Sample("metrics_proxy_duplicate_families", (), float(self._dropped))],
            ),
        ]

    async def _collect(self, openmetrics: bool, gzipped: bool) -> _Collected:
        writer = _metrics.BodyWriter(self._encoder, openmetrics, gzipped)
        writer.reserve(self._own_layout)
        # The fetch writes its request on its first loop turn; the files are read and the vLLM
        # part written and compressed (natively, most of a merge's CPU) while Triton answers.
        # (A worker thread measured no faster: the handoffs cost what the overlap saves.)
        fetch = asyncio.ensure_future(self._scrape_triton())
        await asyncio.sleep(0)
        vllm = self._read_vllm(writer)
        triton = await fetch
        sources = [s for s in (vllm, triton) if s is not None]
        if triton is not None:
            writer.add(triton)
            shared = set(vllm.names()) if vllm is not None else set()
            self._dropped = sum(1 for name in triton.names() if name in shared)
        else:
            self._dropped = 0
        own = _metrics.FamilyList.of(self._own_families())
        writer.add_reserved(own)
        collected = _Collected(self._encoder, self._own_layout, own, sources)
        collected.bodies[(openmetrics, gzipped)] = writer.finish()
        self._finished_at = time.monotonic()
        return collected

    async def collect(self, openmetrics: bool = False, gzipped: bool = False) -> _Collected:
        """Merge the sources once for all scrapes that arrive while a merge is running.

        A merge finished less than ``reuse_s`` ago is served again, so scrapers that come
        together (Prometheus replicas) cost one merge. The merge writes the body of the
        scrape that starts it (``openmetrics``, ``gzipped``) as it goes.
        """
        inflight = self._inflight
        stale = time.monotonic() - self._finished_at >= self.settings.reuse_s
        if inflight is None or (inflight.done() and stale):
            self._inflight = asyncio.ensure_future(self._collect(openmetrics, gzipped))
        # Shielded: a scraper that disconnects must not cancel the merge others wait for.
        return await asyncio.shield(self._inflight)

    def health(self) -> dict[str, Any]:
        """The proxy is healthy while it serves; source health is reported, not required."""
        return {"status": "ok", "sources": {s: st.up for s, st in self._state.items()}}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path, method = scope["path"], scope["method"]
        if path not in ("/metrics", "/healthz"):
            await _respond(send, 404, b"not found: use /metrics or /healthz\n", "text/plain")
            return
        if method not in ("GET", "HEAD"):
            await _respond(send, 405, b"method not allowed: use GET\n", "text/plain")
            return
        if path == "/healthz":
            body = json.dumps(self.health()).encode()
            await _respond(send, 200, body, "application/json", head=method == "HEAD")
            return
        openmetrics, content_type = negotiate(headers.get("accept"))
        gzipped = wants_gzip(headers.get("accept-encoding"))
        collected = await self.collect(openmetrics, gzipped)
        extra = [(b"vary", b"Accept, Accept-Encoding")]
        if gzipped:
            extra.append((b"content-encoding", b"gzip"))
        body = collected.body(openmetrics, gzipped)
        await _respond(send, 200, body, content_type, extra, head=method == "HEAD")

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _respond(
    send: Any,
    status: int,
    body: bytes,
    content_type: str,
    extra: list[tuple[bytes, bytes]] | None = None,
    head: bool = False,
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})


def create_app(settings: ProxySettings) -> MetricsProxyApp:
    """Build the proxy for ``settings``; raises ``ProxyConfigError`` naming a missing variable."""
    return MetricsProxyApp(settings)
