"""The proxy's connections as scrapers see them: kept alive, closed when idle, a scraper that
leaves mid-merge, and a stop with no grace. HTTP itself is uvicorn's."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.metrics_proxy.conftest import make_settings
from tests.support.triton_metrics_server import TritonMetricsServer


async def _request(port: int, target: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET " + target + b" HTTP/1.1\r\nHost: proxy\r\n\r\n")
    await writer.drain()
    return reader, writer


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    body = await reader.readexactly(int(headers["content-length"]))
    return int(lines[0].split(" ")[1]), body


async def test_scrapes_reuse_one_kept_alive_connection(vllm_dir: Path, triton, proxy_factory):
    proxy = await proxy_factory(make_settings(vllm_dir, triton.url))
    reader, writer = await _request(proxy.server.port, b"/metrics")
    for _ in range(3):
        status, body = await _response(reader)
        assert status == 200 and b"metrics_proxy_source_up{" in body
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: proxy\r\n\r\n")
    assert (await _response(reader))[0] == 200
    writer.close()


async def test_a_scraper_that_leaves_mid_merge_costs_nothing(vllm_dir: Path, proxy_factory):
    with TritonMetricsServer(delay_s=0.5) as slow:
        proxy = await proxy_factory(make_settings(vllm_dir, slow.url))
        for _ in range(5):
            _, writer = await _request(proxy.server.port, b"/metrics")
            writer.close()  # gone before the merge it waits for ends
        response = await proxy.metrics()
        assert 'metrics_proxy_source_up{colour="green"' in response.text
        assert 'source="triton"} 1.0' in response.text


async def test_idle_connections_are_closed_after_the_idle_timeout(
    vllm_dir: Path, triton, proxy_factory
) -> None:
    proxy = await proxy_factory(make_settings(vllm_dir, triton.url, idle_timeout_s=0.3))
    # Timed from before the request: the server's idle clock starts after its answer.
    started = time.monotonic()
    reader, writer = await _request(proxy.server.port, b"/healthz")
    assert (await _response(reader))[0] == 200
    assert await asyncio.wait_for(reader.read(1), timeout=30) == b""
    # Closed by the 0.3 s timeout, not the 60 s default; the upper bound leaves a loaded
    # machine room.
    assert 0.2 < time.monotonic() - started < 30
    writer.close()


async def test_stop_with_grace_zero_returns_at_once(vllm_dir: Path, proxy_factory) -> None:
    with TritonMetricsServer(delay_s=5.0) as slow:
        settings = make_settings(vllm_dir, slow.url, graceful_shutdown_s=0.0)
        proxy = await proxy_factory(settings)
        reader, writer = await _request(proxy.server.port, b"/metrics")
        deadline = time.monotonic() + 30
        while slow.requests == 0:  # the scrape's merge is now waiting on Triton
            assert time.monotonic() < deadline, "the scrape never reached Triton"
            await asyncio.sleep(0.01)
        started = time.monotonic()
        proxy.server.stop()
        await asyncio.wait_for(proxy.task, timeout=30)
        # Well under Triton's 5 s delay, which a stop that waited for the scrape would take.
        assert time.monotonic() - started < 4
        # The scrape cut at the grace period is never answered with metrics: uvicorn closes
        # the connection, with a 500 where the response had not started.
        leftover = await asyncio.wait_for(reader.read(), timeout=30)
        assert leftover == b"" or leftover.startswith(b"HTTP/1.1 500 "), leftover[:100]
        writer.close()
