"""Embedded mode's SIGTERM drain: the frontend and then Triton each get the drain deadline, so
each stop is judged against it on its own, not their sum."""

from __future__ import annotations

import sys
from pathlib import Path

from runtime.entrypoint import ExitCode
from tests.runtime.pod import Pod
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]

# On SIGTERM it finishes an in-flight request in FRONTEND_DRAIN_SECONDS, then exits 0.
_FRONTEND = """\
import os, signal, time
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health/ready" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

def drain(*_):
    time.sleep(float(os.environ["FRONTEND_DRAIN_SECONDS"]))
    os._exit(0)

signal.signal(signal.SIGTERM, drain)
HTTPServer(("127.0.0.1", int(os.environ["LLM_SERVING_FRONTEND_PORT"])), Handler).serve_forever()
"""

# As a real Triton unloading a vLLM engine: exits 0 some seconds after SIGTERM, nothing in flight.
_TRITON = f"""\
cd {ROOT}
{sys.executable} -m tests.runtime.slow_standin "$@" &
child=$!
trap 'sleep "$TRITON_EXIT_SECONDS"; kill -TERM $child; wait $child; exit 0' TERM
wait $child
wait $child
"""


def _embedded_pod(tmp_path: Path, drain: str, frontend: str, triton: str) -> Pod:
    (tmp_path / "frontend.py").write_text(_FRONTEND)
    (tmp_path / "triton.sh").write_text(_TRITON)
    pod = Pod.create(tmp_path)
    pod.env.update(
        {
            "LLM_SERVING_SERVING_MODE": "embedded",
            "LLM_SERVING_TRITONSERVER": f"sh {tmp_path / 'triton.sh'}",
            "LLM_SERVING_FRONTEND_COMMAND": f"{sys.executable} {tmp_path / 'frontend.py'}",
            "LLM_SERVING_FRONTEND_PORT": str(free_port()),
            "LLM_SERVING_DRAIN_SECONDS": drain,
            "FRONTEND_DRAIN_SECONDS": frontend,
            "TRITON_EXIT_SECONDS": triton,
        }
    )
    return pod


def test_each_server_within_its_budget_is_drained(tmp_path: Path) -> None:
    # 3 s + 3 s is past the 5 s deadline, but each server stopped well within it.
    pod = _embedded_pod(tmp_path, drain="5", frontend="3", triton="3")
    pod.start().wait_ready()
    code, err = pod.terminate()
    assert code == ExitCode.DRAINED, err
    assert "drained: every in-flight request finished" in err
    assert "drain deadline" not in err


def test_a_frontend_past_its_budget_is_a_deadline(tmp_path: Path) -> None:
    pod = _embedded_pod(tmp_path, drain="1", frontend="2.5", triton="0")
    pod.start().wait_ready()
    code, err = pod.terminate()
    assert code == ExitCode.DRAIN_TIMEOUT, err
    assert "drain deadline of 1s reached (the frontend 2." in err
