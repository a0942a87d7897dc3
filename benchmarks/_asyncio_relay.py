"""The port gate's former relay, asyncio protocols in the entrypoint's event loop, kept only so
that ``benchmarks.startup`` can measure the native relay (``runtime.entrypoint.gate``) against it.
"""

from __future__ import annotations

import asyncio
import socket
from typing import cast

__all__ = ["AsyncioPortGate"]

_HIGH_WATER = 1 << 20


class _Pipe(asyncio.Protocol):
    """One direction's sink: writes what the peer side receives, with back-pressure."""

    def __init__(self, gate: AsyncioPortGate) -> None:
        self.gate = gate
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None
        self._pending = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, so no isinstance check.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.get_extra_info("socket").setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
        )
        self.transport.set_write_buffer_limits(high=_HIGH_WATER)
        self.gate.transports.add(self.transport)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            # The upstream connect is still in progress (pause_reading is only advisory).
            self._pending += data
            return
        if peer.transport.is_closing():
            # The other side is gone; uvloop raises on writes to a closed transport.
            if self.transport is not None:
                self.transport.close()
            return
        peer.transport.write(data)

    def _live_peer(self) -> asyncio.Transport | None:
        # uvloop raises on any call to a closed transport, asyncio ignores it: check first.
        if self.peer is None or self.peer.transport is None or self.peer.transport.is_closing():
            return None
        return self.peer.transport

    def pause_writing(self) -> None:
        if (peer := self._live_peer()) is not None:
            peer.pause_reading()

    def resume_writing(self) -> None:
        if (peer := self._live_peer()) is not None:
            peer.resume_reading()

    def eof_received(self) -> bool:
        peer = self._live_peer()
        if peer is None:
            return False
        if peer.can_write_eof():
            peer.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.gate.transports.discard(self.transport)
        if (peer := self._live_peer()) is not None:
            peer.close()


class _Client(_Pipe):
    """The accepted public connection; it opens its upstream connection to Triton."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.pause_reading()
        self.gate.connecting.add(task := asyncio.ensure_future(self._connect()))
        task.add_done_callback(self.gate.connecting.discard)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        upstream = _Pipe(self.gate)
        upstream.peer, self.peer = self, upstream
        try:
            await loop.create_connection(
                lambda: upstream, self.gate.upstream_host, self.gate.upstream_port
            )
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        if upstream.transport is not None and self._pending:
            upstream.transport.write(self._pending)
            self._pending = b""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()


class AsyncioPortGate:
    """A closed-until-opened TCP relay from ``host:port`` to ``upstream_host:upstream_port``."""

    def __init__(self, host: str, port: int, upstream_host: str, upstream_port: int) -> None:
        self.host, self.port = host, port
        self.upstream_host, self.upstream_port = upstream_host, upstream_port
        self.transports: set[asyncio.Transport] = set()
        self.connecting: set[asyncio.Future[None]] = set()
        self._server: asyncio.base_events.Server | None = None

    @property
    def is_open(self) -> bool:
        """Whether the public port is accepting connections."""
        return self._server is not None and self._server.is_serving()

    async def open(self) -> None:
        """Bind the public port and start relaying."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Client(self), self.host, self.port, reuse_address=True, backlog=1024
        )
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]

    async def stop_accepting(self) -> None:
        """Unbind the public port; relayed connections stay up so in-flight replies arrive."""
        # Not wait_closed(): from Python 3.12 it waits for every relayed connection to end.
        if self._server is not None:
            self._server.close()

    def close_connections(self) -> None:
        """Close every relayed connection (after the server behind them has stopped)."""
        for transport in list(self.transports):
            transport.close()
