"""
The port gate's native byte relay (epoll and splice in its own thread).
"""

from __future__ import annotations

import typing

class Relay:
    """
    A closed-until-opened TCP relay to one upstream address.
    """
    def __init__(
        self,
        upstream_host: str,
        upstream_port: typing.SupportsInt | typing.SupportsIndex,
        splice: bool = True,
    ) -> None:
        """
        Resolve the upstream address and start the relay thread; splice=False copies bulk data
        through user space instead of splice().
        """
    def close(self) -> None:
        """
        Close everything and stop the relay thread.
        """
    def close_connections(self) -> None:
        """
        Close every relayed connection.
        """
    def open(
        self,
        host: str,
        port: typing.SupportsInt | typing.SupportsIndex,
        backlog: typing.SupportsInt | typing.SupportsIndex = 1024,
    ) -> int:
        """
        Bind and listen on every address of host; returns the bound port.
        """
    def stop_accepting(self) -> None:
        """
        Close the listening sockets; relayed connections stay up.
        """
    @property
    def accepting(self) -> bool:
        """
        Whether the public port is listening.
        """
    @property
    def connections(self) -> int:
        """
        How many connections are being relayed.
        """
