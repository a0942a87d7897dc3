"""Runs the proxy under uvicorn until SIGTERM/SIGINT, finishing in-flight scrapes first."""

from __future__ import annotations

import logging
import signal
import socket
import sys

import uvicorn

from runtime.metrics_proxy.app import ProxyConfigError, create_app, settings_from_env
from runtime.metrics_proxy.multiproc import MultiprocReader, ReaderFactory
from runtime.metrics_proxy.settings import ProxySettings

__all__ = ["ProxyServer", "bind", "run_from_env", "serve"]

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, bound here so that errors are one clear line.

    Raises ``ProxyConfigError`` if the host does not resolve, ``RuntimeError`` if the port
    cannot be bound.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ProxyConfigError(f"METRICS_PROXY_HOST: cannot resolve {host!r}: {exc}") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


class ProxyServer:
    """The proxy's app under uvicorn on a socket bound at construction."""

    def __init__(self, settings: ProxySettings, reader: ReaderFactory = MultiprocReader) -> None:
        self.settings = settings
        app = create_app(settings, reader)
        self.socket = bind(settings.host, settings.port)
        self.port: int = self.socket.getsockname()[1]
        # uvicorn annotates both timeouts as int but uses them as seconds (call_later,
        # asyncio.timeout), so the settings' fractions hold.
        config = uvicorn.Config(
            app,
            lifespan="on",
            log_level="warning",
            access_log=False,
            timeout_keep_alive=settings.idle_timeout_s,  # type: ignore[arg-type]
            timeout_graceful_shutdown=settings.graceful_shutdown_s,  # type: ignore[arg-type]
        )
        self.server = uvicorn.Server(config)

    async def serve(self) -> None:
        """Serve until ``stop()`` or a signal; in-flight scrapes get the grace period."""
        await self.server.serve(sockets=[self.socket])

    def stop(self) -> None:
        """Ask the server to stop; ``serve()`` returns once the in-flight scrapes are done."""
        self.server.should_exit = True


def serve(settings: ProxySettings, reader: ReaderFactory = MultiprocReader) -> None:
    """Serve ``/metrics`` and ``/healthz`` on ``settings.host:settings.port`` until signalled."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    server = ProxyServer(settings, reader)
    # uvicorn restores these after its own handlers have run the graceful shutdown, then
    # raises the signal again: without them the default action would kill the process.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
    log.info("metrics proxy serving on %s:%d", settings.host, server.port)
    # uvicorn's runner: its event loop (uvloop where installed), then serve() as above.
    server.server.run(sockets=[server.socket])
    log.info("metrics proxy stopped")


def run_from_env(reader: ReaderFactory = MultiprocReader) -> int:
    """Serve with settings from the environment; a configuration error prints one line, gives 1."""
    try:
        serve(settings_from_env(), reader)
    except (ProxyConfigError, RuntimeError) as exc:  # RuntimeError: e.g. the port is taken
        print(f"metrics proxy: {exc}", file=sys.stderr)
        return 1
    return 0
