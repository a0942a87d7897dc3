"""The port gate: the public gRPC port is not even bound until the model is ready (clients get
"connection refused", never a half-loaded server), then bytes are relayed to Triton's loopback
port by a native relay thread (epoll and splice, no GIL, no parsing), and it closes first on
shutdown. Used in embedded mode and with ``LLM_SERVING_GATE=relay``; a standalone Triton binds
the public port itself (``EntrypointSettings.gate``)."""

from __future__ import annotations

from runtime.entrypoint import _relay

__all__ = ["PortGate"]

_BACKLOG = 1024


class PortGate:
    """A closed-until-opened TCP relay from ``host:port`` to ``upstream_host:upstream_port``.

    Small reads are copied through the relay thread's buffer, bulk data is spliced (zero-copy)
    through a pipe; ``splice=False`` copies bulk data too (as the relay does by itself on
    sockets that refuse splice).
    """

    def __init__(
        self,
        host: str,
        port: int,
        upstream_host: str,
        upstream_port: int,
        *,
        splice: bool = True,
    ) -> None:
        self.host, self.port = host, port
        self.upstream_host, self.upstream_port = upstream_host, upstream_port
        self.splice = splice
        self._native: _relay.Relay | None = None

    @property
    def is_open(self) -> bool:
        """Whether the public port is accepting connections."""
        return self._native is not None and self._native.accepting

    @property
    def connections(self) -> int:
        """How many client connections are being relayed now."""
        return 0 if self._native is None else self._native.connections

    async def open(self) -> None:
        """Bind the public port and start relaying (raises OSError if the port is taken)."""
        # The relay thread starts here, not in __init__: a gate that never opens costs nothing.
        if self._native is None:
            self._native = _relay.Relay(self.upstream_host, self.upstream_port, splice=self.splice)
        self.port = self._native.open(self.host, self.port, _BACKLOG)

    async def stop_accepting(self) -> None:
        """Unbind the public port; relayed connections stay up so in-flight replies arrive."""
        if self._native is not None:
            self._native.stop_accepting()

    def close_connections(self) -> None:
        """Close every relayed connection (after the server behind them has stopped)."""
        if self._native is not None:
            self._native.close_connections()

    def close(self) -> None:
        """Close the port and every connection, and stop the relay thread."""
        if self._native is not None:
            self._native.close()
            self._native = None
