"""The proxy's Starlette app: ``/metrics`` and ``/healthz`` over one ``Scraper`` on app.state."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.metrics_proxy.budget import SCRAPE_TIMEOUT_HEADER, scrape_budget
from runtime.metrics_proxy.exposition import negotiate, wants_gzip
from runtime.metrics_proxy.multiproc import MultiprocReader, ReaderFactory
from runtime.metrics_proxy.scrape import Scraper
from runtime.metrics_proxy.settings import ProxySettings
from runtime.metrics_proxy.triton import TritonClient
from runtime.settings_env import setting_errors

__all__ = ["ProxyConfigError", "create_app", "settings_from_env"]

log = logging.getLogger(__name__)


class ProxyConfigError(ValueError):
    """The proxy's environment is unusable; the message names the variable to set."""


def _check(settings: ProxySettings) -> None:
    if settings.multiproc_dir is None:
        raise ProxyConfigError(
            "PROMETHEUS_MULTIPROC_DIR is not set: point it (or METRICS_PROXY_MULTIPROC_DIR) "
            "at the directory vLLM writes its multiprocess metrics to"
        )
    directory = settings.multiproc_dir
    if (
        settings.mark_dead_processes
        and directory.is_dir()
        and not os.access(directory, os.W_OK | os.X_OK)
    ):
        raise ProxyConfigError(
            f"METRICS_PROXY_MARK_DEAD_PROCESSES removes dead processes' files from {directory}, "
            "which this process cannot write (mounted read-only?): unset it or mount the "
            "directory writable"
        )
    try:
        parts = urlsplit(settings.triton_url)
        port = 80 if parts.port is None else parts.port
        hostname = parts.hostname
    except ValueError:  # an unclosed "[", a port not a number or past 65535
        parts, port, hostname = None, 0, None
    if parts is None or parts.scheme != "http" or not hostname or not 1 <= port <= 65535:
        raise ProxyConfigError(
            "METRICS_PROXY_TRITON_URL: Triton's metrics URL must be http://host[:port]/path "
            f"with a port in 1..65535, got {settings.triton_url!r}"
        )


async def metrics(request: Request) -> Response:
    """The merged exposition, in the format and encoding the scraper prefers, with Triton's
    wait bounded by the scrape timeout the scraper sent (ignored where it is no number)."""
    scraper: Scraper = request.app.state.scraper
    settings: ProxySettings = request.app.state.settings
    openmetrics, content_type = negotiate(request.headers.get("accept"))
    gzipped = wants_gzip(request.headers.get("accept-encoding"))
    budget = scrape_budget(
        request.headers.get(SCRAPE_TIMEOUT_HEADER), settings.scrape_timeout_offset_s
    )
    body = await scraper.body(budget)
    headers = {"Content-Encoding": "gzip"} if gzipped else {}
    headers["Vary"] = "Accept, Accept-Encoding"
    return Response(body.encoded(openmetrics, gzipped), headers=headers, media_type=content_type)


async def healthz(request: Request) -> Response:
    """Liveness, with each source's state after the last scrape (false before the first)."""
    health = request.app.state.scraper.health
    sources = {"triton": health.triton.up, "vllm": health.vllm.up}
    return JSONResponse({"status": "ok", "sources": sources})


def create_app(settings: ProxySettings, reader: ReaderFactory = MultiprocReader) -> Starlette:
    """The proxy for ``settings``; raises ``ProxyConfigError`` naming the variable to set.

    ``reader`` reads vLLM's files (``MultiprocReader``).
    """
    _check(settings)
    directory = settings.multiproc_dir
    assert directory is not None  # checked above

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        triton = TritonClient(
            settings.triton_url, settings.triton_timeout_s, settings.triton_max_bytes
        )
        files = reader(directory, settings.mark_dead_processes)
        app.state.settings = settings
        app.state.scraper = Scraper(
            triton, files, directory, settings.constant_labels(), settings.reuse_s
        )
        try:
            yield
        finally:
            await app.state.scraper.aclose()

    routes = [
        Route("/metrics", metrics, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def settings_from_env() -> ProxySettings:
    """The settings in this process's environment; raises ``ProxyConfigError`` naming each
    variable that does not validate."""
    try:
        return ProxySettings()
    except ValidationError as exc:
        raise ProxyConfigError(setting_errors(ProxySettings, exc)) from exc
