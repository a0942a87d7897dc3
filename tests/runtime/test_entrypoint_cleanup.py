"""Failures nobody planned for still end in one line and the stage's exit code, and never leave
a child process running: a taken port, a manifest that is not UTF-8, an unexpected exception."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from runtime.entrypoint import EntrypointSettings, ExitCode
from runtime.entrypoint.runner import Entrypoint
from tests.runtime.pod import Pod
from tests.runtime.test_entrypoint_failures import failure_line


def _listen(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_taken_public_port_fails_the_start_before_triton_loads(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    public = pod.port("public_grpc")
    with _listen(public):
        code, err = pod.run_to_exit(timeout=60)
    assert code == ExitCode.STAGE_START, err
    line = failure_line(err)
    assert f"stage 7/8 start failed: the public gRPC port 127.0.0.1:{public}" in line
    assert "LLM_SERVING_PUBLIC_GRPC_PORT" in line
    assert "Traceback" not in err and "started " not in err  # Triton never ran
    assert pod.leftover_servers() == []


def test_taken_health_port_is_one_line_and_exit_2(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    with _listen(pod.port("health")):
        code, err = pod.run_to_exit(timeout=60)
    assert code == ExitCode.CONFIG, err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "health port failed" in line]
    assert "LLM_SERVING_HEALTH_PORT" in line


def test_manifest_that_is_not_utf8_fails_locate(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    manifest = pod.root / "version" / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"toy"', b'"to\xff"', 1))
    code, err = pod.run_to_exit()
    assert code == ExitCode.STAGE_LOCATE, err
    assert "manifest.json is not UTF-8" in failure_line(err)
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("broken", "expected"),
    [("_open_gate", ExitCode.STAGE_GATE), ("_serve", ExitCode.INTERNAL)],
)
def test_unexpected_exception_stops_triton(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    broken: str,
    expected: int,
) -> None:
    pod = Pod.create(tmp_path)
    for name, value in pod.env.items():
        monkeypatch.setenv(name, value)

    async def explode(self: Entrypoint, *args: object) -> None:
        assert self.state.processes, "Triton should be running by now"
        raise RuntimeError("boom")

    monkeypatch.setattr(Entrypoint, broken, explode)
    code = asyncio.run(Entrypoint(EntrypointSettings()).run())
    err = capfd.readouterr().err
    assert code == expected, err
    (line,) = [line for line in err.splitlines() if "unexpected RuntimeError" in line]
    assert "boom" in line
    assert pod.leftover_servers() == []
