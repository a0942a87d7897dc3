"""Runs the proxy under uvicorn until SIGTERM/SIGINT, finishing in-flight scrapes first."""

from __future__ import annotations

import logging
import sys

import uvicorn

from runtime.metrics_proxy.app import ProxyConfigError, create_app
from runtime.metrics_proxy.settings import ProxySettings

__all__ = ["run_from_env", "serve"]


def serve(settings: ProxySettings) -> None:
    """Serve ``/metrics`` and ``/healthz`` on ``settings.host:settings.port`` until signalled."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=settings.graceful_shutdown_s,
    )
    # uvicorn handles SIGTERM: stops accepting, lets running requests finish, runs shutdown.
    uvicorn.Server(config).run()


def run_from_env() -> int:
    """Serve with settings from the environment; a configuration error prints one line, gives 1."""
    try:
        serve(ProxySettings())
    except ProxyConfigError as exc:
        print(f"metrics proxy: {exc}", file=sys.stderr)
        return 1
    return 0
