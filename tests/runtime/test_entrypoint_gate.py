"""The port gate relays KServe gRPC byte-for-byte and refuses connections until opened."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import uvloop

from runtime.entrypoint.gate import PortGate
from tests.runtime.pod import infer, port_refuses
from tests.support.kserve_server import KServeStandIn
from tests.support.ports import free_port


@pytest.fixture(scope="module")
def standin() -> Iterator[KServeStandIn]:
    server = KServeStandIn().start()
    yield server


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_gate_refuses_then_relays_concurrent_requests(standin: KServeStandIn, loop: str) -> None:
    port = free_port()
    prompts = [f"the quick brown fox {i}" for i in range(12)]

    async def scenario() -> tuple[bool, list[str], list[str], bool]:
        gate = PortGate("127.0.0.1", port, "127.0.0.1", standin.port)
        refused_before = await asyncio.to_thread(port_refuses, port)
        await gate.open()
        through = await asyncio.gather(*(asyncio.to_thread(infer, port, p, 24) for p in prompts))
        direct = await asyncio.gather(
            *(asyncio.to_thread(infer, standin.port, p, 24) for p in prompts)
        )
        await gate.stop_accepting()
        gate.close_connections()
        refused_after = await asyncio.to_thread(port_refuses, port)
        return refused_before, through, direct, refused_after

    run = uvloop.run if loop == "uvloop" else asyncio.run
    refused_before, through, direct, refused_after = run(scenario())
    assert refused_before and refused_after
    assert through == direct and all(through)


def test_gate_with_nothing_behind_closes_the_client(standin: KServeStandIn) -> None:
    async def scenario() -> bytes:
        gate = PortGate("127.0.0.1", 0, "127.0.0.1", free_port())
        await gate.open()
        # The client is reset, as the upstream refused it: during the connect, or after.
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", gate.port)
            writer.write(b"PRI * HTTP/2.0\r\n\r\n")
            data = await asyncio.wait_for(reader.read(), timeout=30)  # a hang guard only
            writer.close()
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        await gate.stop_accepting()
        return data

    assert asyncio.run(scenario()) == b""
