"""Fixtures for the metrics-proxy tests: real writer processes and an in-process proxy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from runtime.metrics_proxy.server import ProxyServer
from runtime.metrics_proxy.settings import ProxySettings
from tests.support.metrics_harness import WriterProcesses
from tests.support.triton_metrics_server import TritonMetricsServer

POD_LABELS = {"model_id": "llama-3-8b", "model_version": "v7", "colour": "green"}


@pytest.fixture(scope="module")
def vllm_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A multiprocess directory that two real writer processes filled (2 rounds), then left."""
    directory = tmp_path_factory.mktemp("vllm-multiproc")
    with WriterProcesses(directory, 2) as writers:
        writers.tick()
        writers.tick()
    yield directory


@pytest.fixture
def triton() -> Iterator[TritonMetricsServer]:
    with TritonMetricsServer(("llama-3-8b", "mistral-7b")) as server:
        server.advance()
        yield server


def make_settings(multiproc_dir: Path, triton_url: str, **overrides: object) -> ProxySettings:
    """Settings as the pod's env would give them, without reading this process's env."""
    values: dict[str, object] = {
        "multiproc_dir": multiproc_dir,
        "triton_url": triton_url,
        "model_id": POD_LABELS["model_id"],
        "model_version": POD_LABELS["model_version"],
        "colour": POD_LABELS["colour"],
        # Generous: on a loaded machine a 0.5 s bound cut healthy fetches short and made the
        # two scrapes of one test disagree. Tests of a slow Triton set their own bound.
        "triton_timeout_s": 5.0,
        "reuse_s": 0.0,
        **overrides,
    }
    return ProxySettings(**values)  # type: ignore[arg-type]


class InProcessProxy:
    """The proxy's server run in this event loop on a free loopback port, and an httpx client
    speaking to it."""

    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.task = asyncio.create_task(server.serve())
        self.client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=30)

    async def started(self) -> InProcessProxy:
        while not self.server.server.started:
            assert not self.task.done(), "the proxy's server ended at start-up"
            await asyncio.sleep(0.01)
        return self

    async def stop(self) -> None:
        await self.client.aclose()
        self.server.stop()
        await self.task

    async def metrics(self, **headers: str) -> httpx.Response:
        response = await self.client.get("/metrics", headers=headers)
        assert response.status_code == 200, response.text
        return response


@pytest.fixture
async def proxy_factory() -> AsyncIterator:
    started: list[InProcessProxy] = []

    async def factory(settings: ProxySettings) -> InProcessProxy:
        proxy = InProcessProxy(
            ProxyServer(settings.model_copy(update={"host": "127.0.0.1", "port": 0}))
        )
        started.append(proxy)
        return await proxy.started()

    yield factory
    for proxy in started:
        await proxy.stop()
