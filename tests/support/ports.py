"""Free loopback ports for test servers (tests run beside each other on one machine).

Ports come from below the kernel's ephemeral range, each at most once per test process. Asking
the kernel for port 0 instead hands the same port out again about once in 14,000 calls (a pod
takes five in a row), and an outgoing connection's source port can take a chosen port before
its server binds it; neither can happen here.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

__all__ = ["free_port"]

_LOWEST = 10_000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _candidates() -> Iterator[int]:
    """Every port from ``_LOWEST`` up to the ephemeral range once, from a per-process start."""
    try:
        ephemeral = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32_768  # Linux's default
    span = max(ephemeral - _LOWEST, 1)
    start = os.getpid() % span  # two test processes start far apart
    return (_LOWEST + (start + i) % span for i in range(span))


_PORTS = _candidates()  # process-wide on purpose: a port must never be handed out twice


def free_port() -> int:
    """A port nothing listens on right now and no earlier call returned (the caller binds it)."""
    for port in _PORTS:
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:  # in use by something outside the tests
                continue
            return port
    raise RuntimeError(f"no unused port left between {_LOWEST} and the ephemeral range")
