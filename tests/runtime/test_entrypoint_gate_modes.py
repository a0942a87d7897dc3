"""Who holds the public gRPC port: Triton itself (``auto``, standalone) or the relay gate."""

from __future__ import annotations

import time
from pathlib import Path

from tests.runtime.pod import Pod, http_status, infer, port_refuses
from tests.runtime.test_entrypoint_failures import failure_line


def test_standalone_triton_binds_the_public_port_itself(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.start().wait_ready()
    assert infer(pod.port("public_grpc"), "the fox") != ""
    assert port_refuses(pod.port("triton_grpc"))  # no loopback port, no hop
    code, err = pod.terminate()
    assert code == 0, err
    assert f"gRPC on 127.0.0.1:{pod.port('public_grpc')}" in err
    assert "open, served by Triton itself" in err


def test_relay_holds_the_port_of_a_server_that_binds_early(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env.update(
        {
            "LLM_SERVING_GATE": "relay",
            "KSERVE_STANDIN_BIND_EARLY": "1",
            # The window in which the loop below must see the gate refuse while the server
            # listens: wide enough for a poll that a loaded machine stalls for seconds.
            "KSERVE_STANDIN_LOAD_SECONDS": "5",
        }
    )
    pod.start()
    public, upstream = pod.port("public_grpc"), pod.port("triton_grpc")
    held = False
    deadline = time.monotonic() + 60
    while http_status(pod.port("health"), "/readyz") != 200:
        assert time.monotonic() < deadline, pod.stderr()
        if not port_refuses(upstream):  # the server is up and loading...
            held = held or port_refuses(public)  # ...and the gate still refuses
            assert port_refuses(public) or http_status(pod.port("health"), "/readyz") == 200
        time.sleep(0.05)
    assert held
    assert infer(public, "the fox") != ""
    code, err = pod.terminate()
    assert code == 0, err
    assert "open, relayed to Triton's loopback port" in err


def test_auto_refuses_a_server_that_binds_before_it_is_ready(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env.update({"KSERVE_STANDIN_BIND_EARLY": "1", "KSERVE_STANDIN_LOAD_SECONDS": "30"})
    code, err = pod.run_to_exit()
    assert code == 18, err
    line = failure_line(err)
    assert "accepts connections on the public gRPC port" in line
    assert "LLM_SERVING_GATE=relay" in line
    assert port_refuses(pod.port("public_grpc"))
