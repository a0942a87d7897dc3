"""Runs the proxy's native server until SIGTERM/SIGINT, finishing in-flight scrapes first."""

from __future__ import annotations

import logging
import signal
import sys
import threading

from runtime.metrics_proxy.app import ProxyConfigError, create_app, settings_from_env
from runtime.metrics_proxy.settings import ProxySettings

__all__ = ["run_from_env", "serve"]

log = logging.getLogger(__name__)


def serve(settings: ProxySettings) -> None:
    """Serve ``/metrics`` and ``/healthz`` on ``settings.host:settings.port`` until signalled."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    app = create_app(settings)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    port = app.start()
    log.info("metrics proxy serving on %s:%d", settings.host, port)
    # Timed waits: the main thread runs the signal handler only between them.
    while not stop.wait(0.5):
        pass
    log.info("stopping: answering scrapes in flight for up to %gs", settings.graceful_shutdown_s)
    app.stop(settings.graceful_shutdown_s)


def run_from_env() -> int:
    """Serve with settings from the environment; a configuration error prints one line, gives 1."""
    try:
        serve(settings_from_env())
    except ProxyConfigError as exc:
        print(f"metrics proxy: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # e.g. the port is taken
        print(f"metrics proxy: {exc}", file=sys.stderr)
        return 1
    return 0
