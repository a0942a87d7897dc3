"""Who holds the public gRPC port: Triton itself, in either serving mode (no relay, no hop), and
a server that binds it before its model is ready is refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.runtime.pod import Pod, infer, port_refuses
from tests.runtime.test_entrypoint_failures import failure_line
from tests.support.ports import free_port


@pytest.mark.parametrize("mode", ["standalone", "embedded"])
def test_triton_binds_the_public_port_itself(tmp_path: Path, mode: str) -> None:
    pod = Pod.create(tmp_path)
    pod.env["LLM_SERVING_SERVING_MODE"] = mode
    if mode == "embedded":
        pod.env.update(
            {
                "LLM_SERVING_FRONTEND_COMMAND": f"{sys.executable} -m tests.runtime.fake_frontend",
                "LLM_SERVING_FRONTEND_PORT": str(free_port()),
                "FAKE_FRONTEND_RECORD": str(tmp_path / "frontend-env.json"),
            }
        )
    pod.start().wait_ready()
    assert infer(pod.port("public_grpc"), "the fox") != ""
    code, err = pod.terminate()
    assert code == 0, err
    assert f"gRPC on 127.0.0.1:{pod.port('public_grpc')}" in err
    assert "open, served by Triton itself" in err


def test_a_server_that_binds_before_it_is_ready_is_refused(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env.update({"KSERVE_STANDIN_BIND_EARLY": "1", "KSERVE_STANDIN_LOAD_SECONDS": "30"})
    code, err = pod.run_to_exit()
    assert code == 18, err
    line = failure_line(err)
    assert "accepts connections on the public gRPC port" in line
    assert "binds its ports only once the startup models have loaded" in line
    assert "LLM_SERVING_GATE" not in line
    assert port_refuses(pod.port("public_grpc"))
