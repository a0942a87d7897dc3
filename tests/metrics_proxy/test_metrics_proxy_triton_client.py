"""The proxy's kept-alive httpx client for Triton's metrics (``TritonClient``), against a
scripted server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from runtime.metrics_proxy.app import ProxyConfigError, create_app
from runtime.metrics_proxy.server import ProxyServer
from runtime.metrics_proxy.settings import ProxySettings
from runtime.metrics_proxy.triton import TritonClient, TritonScrapeError

Answer = Callable[[int], bytes]
"""The raw response to the n-th request a connection gets (0-based); b"" closes it."""


class ScriptedServer:
    """Answers each request on loopback with ``answer(n)``; counts connections."""

    def __init__(self, answer: Answer, close_after: int | None = None) -> None:
        self.answer = answer
        self.close_after = close_after
        self.connections = 0
        self.url = ""
        self._server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            for n in range(1000):
                await reader.readuntil(b"\r\n\r\n")
                data = self.answer(n)
                if data:
                    writer.write(data)
                    await writer.drain()
                if not data or (self.close_after is not None and n + 1 >= self.close_after):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def __aenter__(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/metrics"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


def _length(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


class Client:
    """``TritonClient`` returning bytes, closed at the end of the test."""

    def __init__(self, url: str, timeout_s: float, max_bytes: int) -> None:
        self.client = TritonClient(url, timeout_s, max_bytes)

    async def fetch(self) -> bytes:
        return (await self.client.fetch()).encode()


@pytest.fixture
async def client_for() -> AsyncIterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(url: str, timeout_s: float = 2.0, max_bytes: int = 1 << 20) -> Client:
        made.append(Client(url, timeout_s, max_bytes))
        return made[-1]

    yield make
    for client in made:
        await client.client.aclose()


async def test_fetches_reuse_one_connection(client_for) -> None:
    async with ScriptedServer(lambda n: _length(b"a %d\n" % n)) as server:
        client = client_for(server.url)
        assert await client.fetch() == b"a 0\n"
        assert await client.fetch() == b"a 1\n"
        assert server.connections == 1


async def test_a_connection_the_server_closed_while_idle_is_replaced(client_for) -> None:
    async with ScriptedServer(lambda n: _length(b"x 1\n"), close_after=1) as server:
        client = client_for(server.url)
        assert await client.fetch() == b"x 1\n"
        await asyncio.sleep(0.05)  # the server has closed it by now
        assert await client.fetch() == b"x 1\n"
        assert server.connections == 2


async def test_chunked_and_close_delimited_bodies(client_for) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\na 1\n\r\n5;ext=1\r\nbc 2\n\r\n0\r\n\r\n"
    )
    async with ScriptedServer(lambda n: chunked) as server:
        client = client_for(server.url)
        assert await client.fetch() == b"a 1\nbc 2\n"
        assert await client.fetch() == b"a 1\nbc 2\n"
        assert server.connections == 1
    closing = b"HTTP/1.0 200 OK\r\n\r\nz 3\n"
    async with ScriptedServer(lambda n: closing, close_after=1) as server:
        client = client_for(server.url)
        assert await client.fetch() == b"z 3\n"
        assert await client.fetch() == b"z 3\n"
        assert server.connections == 2  # no length: the connection ends the body


_CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (_length(b"x" * 2000), "too_large"),
        (_CHUNKED + b"400\r\n" + b"y" * 1024 + b"\r\n" * 2, "too_large"),
        (b"HTTP/1.1 503 Unavailable\r\nContent-Length: 0\r\n\r\n", "http_status"),
        (b"SSH-2.0-nope\r\n\r\n", "connect"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "connect"),
        (b"", "connect"),
    ],
    ids=["length", "chunks", "status", "not-http", "cut", "closed"],
)
async def test_bad_answers_give_their_reason(client_for, answer: bytes, reason: str) -> None:
    async with ScriptedServer(lambda n: answer, close_after=1) as server:
        client = client_for(server.url, max_bytes=1000)
        with pytest.raises(TritonScrapeError) as info:
            await client.fetch()
    assert info.value.reason == reason
    assert server.url in str(info.value)


async def test_a_silent_server_is_cut_at_the_timeout(client_for) -> None:
    async with ScriptedServer(lambda n: b"HTTP/1.1 200 OK\r\n") as server:
        client = client_for(server.url, timeout_s=0.2)
        with pytest.raises(TritonScrapeError) as info:
            # The server never finishes: without the 0.2 s bound this would wait forever.
            # Generous, as a loaded machine can take seconds to run the fetch's thread.
            await asyncio.wait_for(client.fetch(), timeout=10)
    assert info.value.reason == "timeout"


def test_only_plain_http_urls(tmp_path) -> None:
    settings = ProxySettings(multiproc_dir=tmp_path, triton_url="https://127.0.0.1:8002/metrics")
    with pytest.raises(ProxyConfigError, match="http://"):
        create_app(settings)


@pytest.mark.parametrize("port", ["0", "99999", "abc"])
def test_a_triton_url_port_outside_1_to_65535_names_the_variable(tmp_path, port: str) -> None:
    url = f"http://127.0.0.1:{port}/metrics"
    settings = ProxySettings(multiproc_dir=tmp_path, triton_url=url)
    with pytest.raises(ProxyConfigError, match=r"METRICS_PROXY_TRITON_URL.*1\.\.65535"):
        create_app(settings)


def test_a_host_that_does_not_resolve_names_the_variable(tmp_path) -> None:
    settings = ProxySettings(multiproc_dir=tmp_path, host="no-such-host.invalid", port=0)
    with pytest.raises(ProxyConfigError, match="METRICS_PROXY_HOST: cannot resolve"):
        ProxyServer(settings)


async def test_the_pods_proxy_variables_are_never_used(
    client_for, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy that refuses everything: a client that read these would fail to connect.
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:1")
    monkeypatch.setenv("NO_PROXY", "")
    async with ScriptedServer(lambda n: _length(b"a 1\n")) as server:
        assert await client_for(server.url).fetch() == b"a 1\n"
