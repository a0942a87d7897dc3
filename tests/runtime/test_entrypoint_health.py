"""The health server answers probes from the flags it is given, and nothing else."""

from __future__ import annotations

import asyncio
import http.client
import socket

from runtime.entrypoint.health import HealthServer


def _request(port: int, method: str, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_probes_follow_the_state() -> None:
    state = {"live": True, "ready": False}

    async def scenario() -> list[tuple[int, bytes]]:
        server = HealthServer(
            "127.0.0.1",
            0,
            live=lambda: state["live"],
            ready=lambda: state["ready"],
            metrics=lambda: b'startup_stage_seconds{stage="unpack"} 0.5\n',
        )
        await server.start()
        calls = [("GET", "/readyz"), ("GET", "/livez"), ("GET", "/metrics"), ("GET", "/nope")]
        results = [await asyncio.to_thread(_request, server.port, m, p) for m, p in calls]
        state["ready"], state["live"] = True, False
        results.append(await asyncio.to_thread(_request, server.port, "GET", "/readyz?x=1"))
        results.append(await asyncio.to_thread(_request, server.port, "GET", "/livez"))
        results.append(await asyncio.to_thread(_request, server.port, "POST", "/readyz"))
        server.close()
        return results

    results = asyncio.run(scenario())
    assert [status for status, _ in results] == [503, 200, 200, 404, 200, 503, 405]
    assert results[2][1].startswith(b"startup_stage_seconds")


def test_request_over_the_line_limit_is_refused_without_a_traceback() -> None:
    errors: list[dict[str, object]] = []

    def send_oversized(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /" + b"a" * 70_000)  # no CRLFCRLF within the 64 KiB limit
            reply = b""
            try:
                while chunk := sock.recv(4096):
                    reply += chunk
            except ConnectionResetError:
                pass  # the server closes with the rest of the line unread
            return reply

    async def scenario() -> tuple[bytes, int]:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
        server = HealthServer("127.0.0.1", 0, lambda: True, lambda: True, lambda: b"")
        await server.start()
        reply = await asyncio.to_thread(send_oversized, server.port)
        status, _ = await asyncio.to_thread(_request, server.port, "GET", "/livez")
        server.close()
        return reply, status

    reply, status = asyncio.run(scenario())
    assert errors == []
    assert reply.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert status == 200
