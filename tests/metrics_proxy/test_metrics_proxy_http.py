"""The native server's HTTP/1.1, spoken over raw sockets: keep-alive, pipelining, closing, and
malformed or hostile requests, which must never stop it serving."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.metrics_proxy import _metrics
from runtime.metrics_proxy.app import create_app
from runtime.metrics_proxy.exposition import negotiate, wants_gzip
from tests.metrics_proxy.conftest import make_settings
from tests.support.triton_metrics_server import TritonMetricsServer


@pytest.fixture
def server(vllm_dir: Path, triton) -> Iterator[tuple[int, TritonMetricsServer]]:
    app = create_app(make_settings(vllm_dir, triton.url, host="127.0.0.1", port=0))
    port = app.start()
    yield port, triton
    app.stop()


def _connect(port: int) -> socket.socket:
    # A bound against a hang, not a latency check: a loaded machine can stall for seconds.
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def _read_response(sock: socket.socket, buffer: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One response off the socket; what follows it stays in ``buffer``."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {bytes(buffer)!r}"
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk
        rest += chunk
    buffer[:] = rest[length:]
    return status, headers, rest[:length]


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(30)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_keep_alive_and_pipelined_requests(server) -> None:
    port, _ = server
    with _connect(port) as sock:
        buffer = bytearray()
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = _read_response(sock, buffer)
        assert status == 200 and b"vllm:" in body and "connection" not in headers
        # Two requests in one write are answered in order on the same connection.
        sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\nHEAD /metrics HTTP/1.1\r\n\r\n")
        status, headers, body = _read_response(sock, buffer)
        assert status == 200 and headers["content-type"] == "application/json"
        sock.sendall(b"")  # the HEAD answer has a length but no body
        while b"\r\n\r\n" not in buffer:
            buffer += sock.recv(65536)
        head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and rest == b""


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET /metrics HTTP/1.0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
    ],
    ids=["http-1.0", "connection-close"],
)
def test_a_connection_that_asks_to_close_is_closed(server, request_head: bytes) -> None:
    port, _ = server
    with _connect(port) as sock:
        sock.sendall(request_head)
        status, headers, _ = _read_response(sock, bytearray())
        assert status == 200 and headers["connection"] == "close"
        assert _closed(sock)


@pytest.mark.parametrize(
    ("request_head", "status"),
    [
        (b"NONSENSE\r\n\r\n", 400),
        (b"GET /metrics HTTP/2.0\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"POST /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 12x\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"p" * 40000 + b"\r\n\r\n", 431),
    ],
    ids=["request-line", "version", "header", "chunked-body", "length", "huge-head"],
)
def test_malformed_requests_are_refused_and_closed(server, request_head: bytes, status) -> None:
    port, _ = server
    with _connect(port) as sock:
        sock.sendall(request_head)
        got, headers, _ = _read_response(sock, bytearray())
        assert got == status and headers["connection"] == "close"
        assert _closed(sock)
    with _connect(port) as sock:  # and the server goes on serving
        sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert _read_response(sock, bytearray())[0] == 200


def test_a_request_body_is_discarded_and_the_connection_goes_on(server) -> None:
    port, _ = server
    with _connect(port) as sock:
        buffer = bytearray()
        sock.sendall(b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
        status, headers, _ = _read_response(sock, buffer)
        assert status == 405 and headers["allow"] == "GET, HEAD"
        sock.sendall(b"GET /nope?x=1 HTTP/1.1\r\n\r\n")
        assert _read_response(sock, buffer)[0] == 404


def test_a_scraper_that_leaves_mid_merge_costs_nothing(vllm_dir: Path) -> None:
    with TritonMetricsServer(delay_s=0.5) as slow:
        app = create_app(make_settings(vllm_dir, slow.url, host="127.0.0.1", port=0))
        port = app.start()
        try:
            for _ in range(5):
                sock = _connect(port)
                sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                sock.close()  # gone before the merge it waits for ends
            with _connect(port) as sock:
                sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                status, _, body = _read_response(sock, bytearray())
            assert status == 200 and b'metrics_proxy_source_up{source="triton"' in body
        finally:
            app.stop()


def test_input_behind_a_scrape_waiting_for_its_merge_is_bounded(vllm_dir: Path) -> None:
    """A client that keeps sending while its scrape waits is closed, not buffered without end."""
    # Triton's stand-in: its backlog takes the fetch, which nothing answers, so the merge
    # waits until the listener closes.
    with socket.create_server(("127.0.0.1", 0)) as mute:
        url = f"http://127.0.0.1:{mute.getsockname()[1]}/metrics"
        settings = make_settings(vllm_dir, url, host="127.0.0.1", port=0, triton_timeout_s=60)
        app = create_app(settings)
        port = app.start()
        try:
            with _connect(port) as sock:
                sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                junk = b"X" * (1 << 20)
                sent = 0
                with pytest.raises((BrokenPipeError, ConnectionResetError)):
                    for _ in range(64):
                        sock.sendall(junk)
                        sent += len(junk)
                assert sent < 16 << 20
                assert _closed(sock)
        finally:
            mute.close()
            app.stop()


def _rss_mib() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) >> 10


def test_pipelined_scrapes_are_answered_one_at_a_time(vllm_dir: Path, triton) -> None:
    """Unread answers to a burst of pipelined GETs do not pile up: each waits for the one
    before it to be written, and every one still arrives, in order."""
    settings = make_settings(vllm_dir, triton.url, host="127.0.0.1", port=0, reuse_s=30)
    app = create_app(settings)
    port = app.start()
    try:
        with _connect(port) as sock:
            buffer = bytearray()
            sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            status, _, body = _read_response(sock, buffer)
            assert status == 200
            request = b"GET /metrics HTTP/1.1\r\n\r\n"
            count = 30_000 // len(request)  # one burst, under the input bound
            before = _rss_mib()
            sock.sendall(request * count)
            time.sleep(1)  # the server's chance to queue what it would
            # Queued answers would take count * len(body) (here over 100 MiB).
            assert count * len(body) > 100 << 20
            assert _rss_mib() - before < 50
            for _ in range(count):
                assert _read_response(sock, buffer)[:1] == (200,)
            assert not buffer
    finally:
        app.stop()


def test_idle_connections_are_closed_after_the_idle_timeout(vllm_dir: Path, triton) -> None:
    settings = make_settings(vllm_dir, triton.url, host="127.0.0.1", port=0, idle_timeout_s=0.3)
    app = create_app(settings)
    port = app.start()
    try:
        with _connect(port) as sock:
            # Timed from before the request: the server's idle clock starts after its answer.
            started = time.monotonic()
            sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            assert _read_response(sock, bytearray())[0] == 200
            assert _closed(sock)
            # Closed by the 0.3 s timeout, not the 60 s default; the upper bound leaves a
            # loaded machine room.
            assert 0.2 < time.monotonic() - started < 30
    finally:
        app.stop()


def test_stop_with_grace_zero_returns_at_once(vllm_dir: Path) -> None:
    with TritonMetricsServer(delay_s=0.3) as slow:
        app = create_app(make_settings(vllm_dir, slow.url, host="127.0.0.1", port=0))
        port = app.start()
        with _connect(port) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            deadline = time.monotonic() + 30
            while slow.requests == 0:  # the scrape's merge is now waiting on Triton
                assert time.monotonic() < deadline, "the scrape never reached Triton"
                time.sleep(0.01)
            started = time.monotonic()
            app.stop(0)
            # The merge in flight ends within Triton's delay; nobody is answered. Well under
            # the connection's 60 s idle timeout, which a stop that waited for it would take.
            assert time.monotonic() - started < 10
            assert _closed(sock)


_MEDIA = st.sampled_from(
    ["application/openmetrics-text", "text/plain", "text/*", "*/*", "text/html", "TEXT/PLAIN"]
)
_Q = st.sampled_from(
    [
        "",
        ";q=0",
        ";q=0.5",
        ";q=1",
        "; q=0.75",
        ";q=bad",
        ";version=1.0.0",
        ";q=",
        ";q=0.00",
        ";q=0.000",
        ";Q=0",
        ";Q=0.1",
        ";q=0.001",
        ";q=1.000",
        ";q=1.5",
        ";q=0.0001",
        ";q=0.",
    ]
)
_ACCEPT = st.lists(st.tuples(_MEDIA, _Q).map("".join), max_size=4).map(", ".join)
_ENCODING = st.lists(
    st.tuples(st.sampled_from(["gzip", "GZIP", "br", "identity", "*"]), _Q).map("".join),
    max_size=3,
).map(",".join)


@pytest.mark.parametrize("encoding", ["gzip;q=0.00", "gzip;q=0.000", "gzip;Q=0", "gzip;q=0."])
def test_native_gzip_refused_with_any_spelling_of_q_zero(encoding: str) -> None:
    assert not _metrics.wants_gzip(encoding)
    assert _metrics.wants_gzip(encoding.replace("0", "1", 1))


def test_native_openmetrics_q_name_is_case_insensitive() -> None:
    assert not _metrics.wants_openmetrics("application/openmetrics-text;Q=0.1,text/plain;q=0.5")
    assert _metrics.wants_openmetrics("application/openmetrics-text;Q=0.6,text/plain;q=0.5")


@given(accept=_ACCEPT, encoding=_ENCODING)
def test_native_negotiation_matches_the_reference(accept: str, encoding: str) -> None:
    assert _metrics.wants_openmetrics(accept) == negotiate(accept)[0]
    assert _metrics.wants_gzip(encoding) == wants_gzip(encoding)
