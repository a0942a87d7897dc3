"""The proxy's configuration and lifecycle around the native server (``_metrics.ScrapeServer``:
HTTP, Triton's fetch, the merge, each source's health and the proxy's own families)."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from runtime.metrics_proxy import _metrics
from runtime.metrics_proxy.multiproc import mark_dead_processes
from runtime.metrics_proxy.settings import ProxySettings
from runtime.settings_env import setting_errors

__all__ = ["MetricsProxyApp", "ProxyConfigError", "create_app", "settings_from_env"]

log = logging.getLogger(__name__)


class ProxyConfigError(ValueError):
    """The proxy's environment is unusable; the message names the variable to set."""


class MetricsProxyApp:
    """The native server for ``settings``: started, stopped, and its warnings logged."""

    def __init__(self, settings: ProxySettings) -> None:
        if settings.multiproc_dir is None:
            raise ProxyConfigError(
                "PROMETHEUS_MULTIPROC_DIR is not set: point it (or METRICS_PROXY_MULTIPROC_DIR) "
                "at the directory vLLM writes its multiprocess metrics to"
            )
        parts = urlsplit(settings.triton_url)
        try:
            port = 80 if parts.port is None else parts.port
        except ValueError:  # not a number, or past 65535
            port = 0
        if parts.scheme != "http" or not parts.hostname or not 1 <= port <= 65535:
            raise ProxyConfigError(
                "METRICS_PROXY_TRITON_URL: Triton's metrics URL must be http://host[:port]/path "
                f"with a port in 1..65535, got {settings.triton_url!r}"
            )
        self.settings = settings
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._triton = (parts.hostname, port, path)
        self._server: Any = None

    def start(self) -> int:
        """Start the native server on ``settings.host:settings.port``; the bound port.

        Raises ``ProxyConfigError`` if the host does not resolve, ``RuntimeError`` if the port
        cannot be bound.
        """
        s = self.settings
        host, port, path = self._triton
        server = _metrics.ScrapeServer(
            host=s.host,
            port=s.port,
            reuse_s=s.reuse_s,
            idle_timeout_s=s.idle_timeout_s,
            triton_host=host,
            triton_port=port,
            triton_path=path,
            triton_timeout_s=s.triton_timeout_s,
            triton_max_bytes=s.triton_max_bytes,
            directory=str(s.multiproc_dir),
            constant_labels=list(s.constant_labels()),
            warn=lambda line: log.warning("%s", line),
            prepare=self._mark_dead if s.mark_dead_processes else None,
        )
        try:
            bound = server.start()
        except ValueError as exc:  # the only invalid_argument of start(): an unknown host
            raise ProxyConfigError(f"METRICS_PROXY_HOST: {exc}") from exc
        self._server = server
        return bound

    def stop(self, grace_s: float = 0.0) -> None:
        """Stop accepting, answer the scrapes in flight for up to ``grace_s``, end."""
        if self._server is not None:
            self._server.stop(grace_s)
            self._server = None

    def _mark_dead(self) -> None:
        mark_dead_processes(self.settings.multiproc_dir)  # type: ignore[arg-type]


def settings_from_env() -> ProxySettings:
    """The settings in this process's environment; raises ``ProxyConfigError`` naming each
    variable that does not validate."""
    try:
        return ProxySettings()
    except ValidationError as exc:
        raise ProxyConfigError(setting_errors(ProxySettings, exc)) from exc


def create_app(settings: ProxySettings) -> MetricsProxyApp:
    """Build the proxy for ``settings``; raises ``ProxyConfigError`` naming what to set."""
    return MetricsProxyApp(settings)
