"""The gate's native relay on raw TCP: large payloads with back-pressure, half-close, resets,
an upstream that refuses, many connections, and the control calls (open, stop, close)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from runtime.entrypoint import _relay
from runtime.entrypoint.gate import PortGate
from tests.runtime.pod import port_refuses
from tests.support.ports import free_port

MODES = [pytest.param(True, id="splice"), pytest.param(False, id="copy")]
# Hang guards only: every wait below ends as soon as its condition holds.
GUARD_SECONDS = 30


class Upstream:
    """A loopback TCP server running ``handler(conn)`` in a thread per accepted connection."""

    def __init__(self, handler: Callable[[socket.socket], None]) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.errors: list[BaseException] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            conn.settimeout(GUARD_SECONDS)
            self.accepted.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            self.handler(conn)
        except OSError as exc:
            self.errors.append(exc)

    def close(self) -> None:
        self.listener.close()
        for conn in self.accepted:
            conn.close()


def echo(conn: socket.socket) -> None:
    """Echo until EOF, then half-close: it blocks in sendall while the client does not read."""
    while data := conn.recv(1 << 16):
        conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)


@pytest.fixture
def echo_upstream() -> Iterator[Upstream]:
    server = Upstream(echo)
    yield server
    server.close()


@pytest.fixture
def relays() -> Iterator[list[_relay.Relay]]:
    made: list[_relay.Relay] = []
    yield made
    for relay in made:
        relay.close()


def open_relay(
    relays: list[_relay.Relay], upstream_port: int, splice: bool = True
) -> tuple[_relay.Relay, int]:
    relay = _relay.Relay("127.0.0.1", upstream_port, splice=splice)
    relays.append(relay)
    return relay, relay.open("127.0.0.1", 0)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=GUARD_SECONDS)
    return sock


def read_all(sock: socket.socket, chunk: int = 1 << 16) -> bytes:
    parts = []
    while data := sock.recv(chunk):
        parts.append(data)
    return b"".join(parts)


def wait_until(condition: Callable[[], bool]) -> bool:
    """Poll ``condition`` until it holds (True) or the hang guard passes (False)."""
    done = threading.Event()
    for _ in range(GUARD_SECONDS * 100):
        if condition():
            return True
        done.wait(0.01)
    return condition()


@pytest.mark.parametrize("splice", MODES)
def test_large_payloads_both_ways_through_a_slow_reader(
    relays: list[_relay.Relay], echo_upstream: Upstream, splice: bool
) -> None:
    # The echo blocks whenever the client's small reads lag, so both directions keep stalling
    # and resuming: every byte must still arrive, in order.
    relay, port = open_relay(relays, echo_upstream.port, splice)
    payload = random.Random(5).randbytes(12 << 20)
    sock = connect(port)

    def write() -> None:
        view = memoryview(payload)
        for start in range(0, len(payload), 1 << 20):
            sock.sendall(view[start : start + (1 << 20)])
        sock.shutdown(socket.SHUT_WR)

    writer = threading.Thread(target=write)
    writer.start()
    received = read_all(sock, chunk=4096)
    writer.join()
    sock.close()
    assert len(received) == len(payload)
    assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()
    assert wait_until(lambda: relay.connections == 0)
    assert echo_upstream.errors == []


@pytest.mark.parametrize("splice", MODES)
def test_a_reader_that_stops_stops_the_writer(relays: list[_relay.Relay], splice: bool) -> None:
    # The upstream reads nothing until told: the relay must stop reading the client (bounded
    # buffers), then deliver everything once the upstream reads again.
    go = threading.Event()
    got: list[bytes] = []

    def stalled(conn: socket.socket) -> None:
        go.wait(GUARD_SECONDS)
        got.append(read_all(conn))

    upstream = Upstream(stalled)
    try:
        _, port = open_relay(relays, upstream.port, splice)
        sock = connect(port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        sock.setblocking(False)
        block = random.Random(7).randbytes(1 << 20)
        sent = bytearray()
        attempt = 160 << 20
        while len(sent) < attempt:
            # Stalled: not writable for 2 s. The kernel's buffers on the way hold at most
            # about 37 MiB (tcp_rmem max 32 MiB + tcp_wmem max 4 MiB + pipe), never 160.
            _, writable, _ = select.select([], [sock], [], 2)
            if not writable:
                break
            try:
                n = sock.send(block)
            except BlockingIOError:
                continue
            sent += block[:n]
            block = block[n:] + block[:n]
        assert 0 < len(sent) < 64 << 20
        sock.settimeout(GUARD_SECONDS)
        sock.shutdown(socket.SHUT_WR)
        go.set()
        assert wait_until(lambda: len(got) == 1)
        assert got[0] == bytes(sent)
        sock.close()
    finally:
        go.set()
        upstream.close()


@pytest.mark.parametrize("splice", MODES)
def test_half_close_travels_both_ways(relays: list[_relay.Relay], splice: bool) -> None:
    # The client half-closes after its request; the upstream answers after reading the EOF,
    # then keeps reading after half-closing itself: both FINs must pass without closing early.
    seen: list[bytes] = []

    def answer_after_eof(conn: socket.socket) -> None:
        request = read_all(conn)
        seen.append(request)
        conn.sendall(b"answer to " + request)
        conn.shutdown(socket.SHUT_WR)

    upstream = Upstream(answer_after_eof)
    try:
        relay, port = open_relay(relays, upstream.port, splice)
        sock = connect(port)
        sock.sendall(b"question")
        sock.shutdown(socket.SHUT_WR)
        assert read_all(sock) == b"answer to question"
        assert seen == [b"question"]
        sock.close()
        assert wait_until(lambda: relay.connections == 0)
    finally:
        upstream.close()


_PAUSABLE_RELAY = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_relay", sys.argv[1])  # the caller's build
_relay = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_relay)
relay = _relay.Relay("127.0.0.1", int(sys.argv[2]), splice=sys.argv[3] == "1")
print(relay.open("127.0.0.1", 0), flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def paused_relay(upstream_port: int, splice: bool) -> Iterator[tuple[int, Callable[[], None]]]:
    """A relay in a child process (this process's build), its port, and a context that stops
    the child (SIGSTOP) while its body runs, so that what the body sends waits unread."""
    argv = [_relay.__file__, str(upstream_port), str(int(splice))]
    child = subprocess.Popen(
        [sys.executable, "-c", _PAUSABLE_RELAY, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())

        @contextlib.contextmanager
        def stopped() -> Iterator[None]:
            child.send_signal(signal.SIGSTOP)
            try:
                yield
            finally:
                child.send_signal(signal.SIGCONT)

        yield port, stopped
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("splice", MODES)
def test_bytes_and_fin_that_arrive_together_both_pass(splice: bool) -> None:
    # With the relay stopped, each side's last bytes and its FIN are queued before the relay
    # reads them, so one wake-up reports both: the relay must read past the bytes to the FIN.
    requests: list[bytes] = []
    answer = threading.Event()

    def answer_after_eof(conn: socket.socket) -> None:
        requests.append(read_all(conn))
        answer.wait(GUARD_SECONDS)
        conn.sendall(b"answer")
        conn.shutdown(socket.SHUT_WR)

    upstream = Upstream(answer_after_eof)
    try:
        with paused_relay(upstream.port, splice) as (port, stopped):
            sock = connect(port)
            assert wait_until(lambda: len(upstream.accepted) == 1)
            with stopped():
                sock.sendall(b"question")
                sock.shutdown(socket.SHUT_WR)
                threading.Event().wait(0.2)
            assert wait_until(lambda: len(requests) == 1)
            assert requests == [b"question"]
            with stopped():
                answer.set()
                threading.Event().wait(0.2)
            assert read_all(sock) == b"answer"
            sock.close()
    finally:
        answer.set()
        upstream.close()


def test_upstream_half_close_leaves_the_client_sending(relays: list[_relay.Relay]) -> None:
    got: list[bytes] = []

    def greet_then_listen(conn: socket.socket) -> None:
        conn.sendall(b"hello")
        conn.shutdown(socket.SHUT_WR)
        got.append(read_all(conn))

    upstream = Upstream(greet_then_listen)
    try:
        _, port = open_relay(relays, upstream.port)
        sock = connect(port)
        assert read_all(sock) == b"hello"  # the upstream's FIN reached the client
        sock.sendall(b"still talking")
        sock.shutdown(socket.SHUT_WR)
        assert wait_until(lambda: len(got) == 1)
        assert got == [b"still talking"]
        sock.close()
    finally:
        upstream.close()


def test_refused_upstream_resets_the_client(relays: list[_relay.Relay]) -> None:
    relay, port = open_relay(relays, free_port())
    for _ in range(3):
        # The relay resets the client, as the upstream refused it: the reset may end the
        # connect, the write, or come as the answer to it.
        try:
            with connect(port) as sock:
                sock.sendall(b"PRI * HTTP/2.0\r\n\r\n")
                data = sock.recv(100)  # the guard timeout raises TimeoutError, failing the test
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        assert data == b""
    assert relay.connections == 0
    assert relay.accepting  # one refused upstream does not stop the gate


def test_client_reset_closes_the_upstream(
    relays: list[_relay.Relay], echo_upstream: Upstream
) -> None:
    relay, port = open_relay(relays, echo_upstream.port)
    sock = connect(port)
    sock.sendall(b"ping")
    assert sock.recv(4) == b"ping"
    # SO_LINGER 0: close() sends RST instead of FIN.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
    assert wait_until(lambda: relay.connections == 0)


@pytest.mark.parametrize("splice", MODES)
def test_many_concurrent_connections(
    relays: list[_relay.Relay], echo_upstream: Upstream, splice: bool
) -> None:
    relay, port = open_relay(relays, echo_upstream.port, splice)
    socks = [connect(port) for _ in range(200)]
    for i, sock in enumerate(socks):
        sock.sendall(f"message {i}".encode())
    replies = [sock.recv(100) for sock in socks]
    assert replies == [f"message {i}".encode() for i in range(200)]
    assert relay.connections == 200
    for sock in socks[:100]:
        sock.close()
    assert wait_until(lambda: relay.connections == 100)
    for sock in socks[100:]:
        sock.close()
    assert wait_until(lambda: relay.connections == 0)


def test_close_connections_ends_every_relayed_connection(
    relays: list[_relay.Relay], echo_upstream: Upstream
) -> None:
    relay, port = open_relay(relays, echo_upstream.port)
    socks = [connect(port) for _ in range(5)]
    for sock in socks:
        sock.sendall(b"x")
        assert sock.recv(1) == b"x"
    relay.close_connections()
    assert relay.connections == 0  # synchronous: done when the call returns
    for sock in socks:
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(1) == b""
        sock.close()
    fresh = connect(port)  # still accepting
    fresh.sendall(b"y")
    assert fresh.recv(1) == b"y"
    fresh.close()


def test_stop_accepting_keeps_relayed_connections(
    relays: list[_relay.Relay], echo_upstream: Upstream
) -> None:
    relay, port = open_relay(relays, echo_upstream.port)
    sock = connect(port)
    relay.stop_accepting()
    assert not relay.accepting
    assert port_refuses(port)
    sock.sendall(b"in flight")
    assert sock.recv(100) == b"in flight"
    sock.close()


def test_control_errors(relays: list[_relay.Relay], echo_upstream: Upstream) -> None:
    relay, port = open_relay(relays, echo_upstream.port)
    with pytest.raises(RuntimeError, match="already accepting"):
        relay.open("127.0.0.1", 0)
    other = _relay.Relay("127.0.0.1", echo_upstream.port)
    relays.append(other)
    with pytest.raises(OSError, match=f"cannot bind 127.0.0.1:{port}") as taken:
        other.open("127.0.0.1", port)
    assert taken.value.errno is not None and taken.value.errno > 0
    with pytest.raises(ValueError, match=r"port must be in 0\.\.65535"):
        other.open("127.0.0.1", 70000)
    with pytest.raises(OSError, match=r"cannot resolve host 'no\.such\.host\.invalid'"):
        _relay.Relay("no.such.host.invalid", 1)
    relay.close()
    assert port_refuses(port)
    relay.close()  # idempotent
    with pytest.raises(RuntimeError, match="the relay is closed"):
        relay.stop_accepting()


def test_port_gate_wraps_the_relay(echo_upstream: Upstream) -> None:
    async def scenario() -> None:
        gate = PortGate("127.0.0.1", 0, "127.0.0.1", echo_upstream.port)
        assert not gate.is_open and gate.connections == 0
        gate.close_connections()  # nothing opened yet: nothing to do
        await gate.stop_accepting()
        await gate.open()
        assert gate.is_open and gate.port != 0
        reader, writer = await asyncio.open_connection("127.0.0.1", gate.port)
        writer.write(b"through the gate")
        assert await reader.readexactly(16) == b"through the gate"
        assert gate.connections == 1
        await gate.stop_accepting()
        assert not gate.is_open
        gate.close_connections()
        assert await reader.read() == b""
        writer.close()
        gate.close()
        assert gate.connections == 0

    asyncio.run(scenario())


_RESET = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # struct linger {1, 0}: close() sends RST


@pytest.mark.parametrize("splice", MODES)
def test_an_upstream_reset_reaches_the_client_as_a_reset(
    relays: list[_relay.Relay], splice: bool
) -> None:
    """A stream the upstream aborts must not look complete to the client (a clean EOF)."""

    def abort_mid_reply(conn: socket.socket) -> None:
        conn.recv(4)
        conn.sendall(b"x" * (1 << 20))
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        conn.close()

    upstream = Upstream(abort_mid_reply)
    try:
        _, port = open_relay(relays, upstream.port, splice)
        sock = connect(port)
        sock.sendall(b"ping")
        with pytest.raises(ConnectionResetError):
            read_all(sock)
        sock.close()
    finally:
        upstream.close()


def test_a_client_reset_reaches_the_upstream_as_a_reset(relays: list[_relay.Relay]) -> None:
    seen: list[BaseException | bytes] = []

    def read_to_end(conn: socket.socket) -> None:
        try:
            seen.append(read_all(conn))
        except ConnectionResetError as exc:
            seen.append(exc)

    upstream = Upstream(read_to_end)
    try:
        relay, port = open_relay(relays, upstream.port)
        sock = connect(port)
        sock.sendall(b"half a request")
        assert wait_until(lambda: len(upstream.accepted) == 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        sock.close()
        assert wait_until(lambda: bool(seen))
        assert isinstance(seen[0], ConnectionResetError), seen
        assert wait_until(lambda: relay.connections == 0)
    finally:
        upstream.close()


def test_the_ipv6_wildcard_takes_ipv4_clients_too(
    relays: list[_relay.Relay], echo_upstream: Upstream
) -> None:
    """``::`` is every address, as for a server that binds it itself (dual-stack)."""
    relay = _relay.Relay("127.0.0.1", echo_upstream.port)
    relays.append(relay)
    port = relay.open("::", 0)
    for host in ("127.0.0.1", "::1"):
        with socket.create_connection((host, port), timeout=GUARD_SECONDS) as sock:
            sock.sendall(b"ping")
            assert sock.recv(4) == b"ping", host


_STARVED_GATE = """
import sys, time
from runtime.entrypoint import _relay
relay = _relay.Relay("127.0.0.1", int(sys.argv[1]))
print(relay.open("127.0.0.1", 0), flush=True)
for line in sys.stdin:
    print(relay.connections, flush=True)
"""


# Two limits of opposite parity: whichever way the process's own descriptors fall, the relay
# runs out with one descriptor left under one of them (a client without an upstream socket).
@pytest.mark.parametrize("descriptors", [64, 65])
def test_clients_left_waiting_for_descriptors_are_relayed_once_some_free(
    echo_upstream: Upstream, descriptors: int
) -> None:
    """Out of descriptors, accepted clients wait in the backlog, none is accepted only to be
    closed; each connection that closes lets the next ones in."""
    gate = subprocess.Popen(
        ["bash", "-c",
         f'ulimit -n {descriptors}; exec "{sys.executable}" -c "$0" {echo_upstream.port}',
         _STARVED_GATE],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert gate.stdin is not None and gate.stdout is not None
    try:
        port = int(gate.stdout.readline())
        clients = [connect(port) for _ in range(40)]  # more than the descriptors can relay
        for sock in clients:
            sock.sendall(b"ping")

        def relayed() -> int:
            gate.stdin.write("?\n")
            gate.stdin.flush()
            return int(gate.stdout.readline())

        def answered() -> list[socket.socket]:
            return select.select(clients, [], [], 0)[0]

        # The count is read while the relay thread may still be accepting: the answers settle
        # on it only once that thread has moved on to relaying.
        def settled() -> bool:
            count = relayed()
            if count == 0 or len(answered()) != count:
                return False
            threading.Event().wait(0.2)
            return relayed() == count and len(answered()) == count

        assert wait_until(settled), f"{relayed()} relayed, {len(answered())} answered"
        served = answered()
        waiting = [s for s in clients if s not in served]
        assert waiting
        for sock in served:
            assert sock.recv(4) == b"ping"
            sock.close()
        for sock in waiting:
            ready, _, _ = select.select([sock], [], [], GUARD_SECONDS)
            assert ready and sock.recv(4) == b"ping"
            sock.close()
    finally:
        gate.kill()
        gate.wait()
