"""SIGTERM during traffic: the port closes first, every in-flight request finishes, exit 0."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from runtime.entrypoint import ExitCode
from tests.runtime.pod import Pod, http_status, infer, port_refuses, wait_for_file
from tests.support.kserve_server import KServeStandIn
from tests.support.ports import free_port

PROMPTS = [f"the quick brown fox {i}" for i in range(8)]
TOKENS = 30


@pytest.fixture(scope="module")
def expected() -> Iterator[dict[str, str]]:
    standin = KServeStandIn().start()
    yield {p: infer(standin.port, p, TOKENS) for p in PROMPTS}


def _traffic(
    port: int, results: dict[str, object], finished: dict[str, float]
) -> list[threading.Thread]:
    def one(prompt: str) -> None:
        try:
            results[prompt] = infer(port, prompt, TOKENS)
        except Exception as exc:  # recorded: a lost request fails the test
            results[prompt] = exc
        finished[prompt] = time.monotonic()

    threads = [threading.Thread(target=one, args=(p,)) for p in PROMPTS]
    for thread in threads:
        thread.start()
    return threads


def _wait_until_received(record: Path) -> None:
    """Until the stand-in has recorded every prompt's request: they are in flight (a fixed
    sleep is not enough on a loaded machine, and a request sent after SIGTERM is refused)."""
    deadline = time.monotonic() + 20
    while not record.exists() or len(record.read_text().splitlines()) < len(PROMPTS):
        assert time.monotonic() < deadline, "the requests never reached the stand-in"
        time.sleep(0.02)


# Triton binds the public port and closes it on SIGTERM itself; in embedded mode it gets
# SIGTERM once the frontend has stopped (at once here: the fake frontend holds no request).
@pytest.mark.parametrize("mode", ["standalone", "embedded"])
def test_sigterm_during_traffic_loses_no_request(
    tmp_path: Path, expected: dict[str, str], mode: str
) -> None:
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
    record = tmp_path / "requests.jsonl"
    release = tmp_path / "release"
    pod.env["STANDIN_TOKEN_DELAY_SECONDS"] = "0.05"  # ~1.5 s per request once released
    # Every request waits for this file after it is received, so none can finish before the
    # port has closed, however slowly this machine runs the steps in between.
    pod.env["STANDIN_HOLD_UNTIL_FILE"] = str(release)
    pod.env["KSERVE_STANDIN_RECORD"] = str(record)
    pod.start().wait_ready()
    public = pod.port("public_grpc")
    results: dict[str, object] = {}
    finished: dict[str, float] = {}
    threads = _traffic(public, results, finished)
    try:
        _wait_until_received(record)
        assert pod.process is not None
        pod.process.send_signal(15)
        sigterm_at = time.monotonic()
        closed_at = None
        # A hang guard: the requests wait for the release, and the drain allows 10 s.
        while closed_at is None and time.monotonic() - sigterm_at < 30:
            if port_refuses(public):
                closed_at = time.monotonic()
            time.sleep(0.02)
        assert closed_at is not None, "the public port stayed open after SIGTERM"
        assert http_status(pod.port("health"), "/readyz") in (503, None)
    finally:
        release.touch()
    for thread in threads:
        thread.join(timeout=30)
    code, err = pod.wait_exit()  # signalled above: a second SIGTERM could land as it exits
    assert results == expected, err
    # The requests really were in flight: each finished after the port had closed.
    assert all(t > closed_at for t in finished.values())
    assert code == 0, err
    assert "drained: every in-flight request finished" in err
    assert ("SIGTERM: draining the frontend, then Triton" in err) == (mode == "embedded")


def test_drain_deadline_is_reported_with_its_own_exit_code(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env["STANDIN_TOKEN_DELAY_SECONDS"] = "0.5"  # 15 s per request
    pod.env["LLM_SERVING_DRAIN_SECONDS"] = "1"
    record = tmp_path / "requests.jsonl"
    pod.env["KSERVE_STANDIN_RECORD"] = str(record)
    pod.start().wait_ready()
    results: dict[str, object] = {}
    threads = _traffic(pod.port("public_grpc"), results, {})
    _wait_until_received(record)
    code, err = pod.terminate()
    for thread in threads:
        thread.join(timeout=30)
    assert code == 21, err
    assert "drain deadline of 1s reached" in err


def test_triton_dying_during_the_drain_is_not_a_deadline(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    record = tmp_path / "requests.jsonl"
    pod.env["STANDIN_TOKEN_DELAY_SECONDS"] = "0.2"  # 6 s per request, well inside 10 s
    pod.env["KSERVE_STANDIN_RECORD"] = str(record)
    pod.start().wait_ready()
    threads = _traffic(pod.port("public_grpc"), {}, {})
    _wait_until_received(record)
    assert pod.process is not None
    (triton,) = pod.leftover_servers()
    pod.process.send_signal(15)
    pod.wait_for_line("SIGTERM: closing the public port")  # killed while draining, not serving
    triton.kill()
    code, err = pod.wait_exit()  # signalled above: a second SIGTERM could land as it exits
    for thread in threads:
        thread.join(timeout=30)
    assert code == ExitCode.DRAIN_SERVER_EXITED, err
    assert f"drain failed: process {triton.pid} was killed by SIGKILL" in err
    assert "deadline of 10s reached" not in err


def test_idle_stop_with_a_zero_deadline_is_drained(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env["LLM_SERVING_DRAIN_SECONDS"] = "0"
    pod.start().wait_ready()
    code, err = pod.terminate()
    assert code == ExitCode.DRAINED, err
    assert "drained: every in-flight request finished" in err


@pytest.mark.parametrize("late", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_during_the_exit_leaves_the_exit_code(tmp_path: Path, late: str) -> None:
    """A second signal that lands once the drain is over, while Python tears down its
    modules, does not turn exit 0 into a death by that signal."""
    pod = Pod.create(tmp_path)
    hook = Path(__file__).parent / "late_signal"
    pod.env["PYTHONPATH"] = os.pathsep.join([str(hook), pod.env["PYTHONPATH"]])
    pod.env["POD_TEST_LATE_SIGNAL"] = late
    pod.start().wait_ready()
    code, err = pod.terminate()
    assert code == ExitCode.DRAINED, err
    assert "drained: every in-flight request finished" in err
    assert "Traceback" not in err, err


def test_sigterm_while_the_model_loads_cancels_the_start(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env["KSERVE_STANDIN_LOAD_SECONDS"] = "60"
    pod.start().wait_for_line("stage 7/8 start done")
    time.sleep(0.5)
    started = time.monotonic()
    code, err = pod.terminate()
    assert code == ExitCode.DRAINED, err
    # Well under the 60 s load, which a stop that waited for it would take.
    assert time.monotonic() - started < 30, "the stop waited for the model to load"
    assert "SIGTERM during stage 8/8 gate: start cancelled, nothing to drain" in err
    assert "stage 8/8 gate done" not in err
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(pod.root / "prom"))
    stages = {s.labels["stage"] for m in registry.collect() for s in m.samples}
    assert "start" in stages and "gate" not in stages
    assert pod.leftover_servers() == []


def test_sigterm_during_an_early_stage_stops_after_it(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    held, release = pod.hold_pip()
    pod.start()
    assert wait_for_file(held), pod.stderr()
    assert pod.process is not None
    pod.process.send_signal(signal.SIGTERM)
    release.touch()  # pip goes on: the stage it runs in is not interrupted
    code, err = pod.wait_exit()
    assert code == ExitCode.DRAINED, err
    assert "SIGTERM after stage 3/8 plugins: start cancelled, nothing to drain" in err
    assert "stage 4/8" not in err and "started" not in err


@pytest.mark.parametrize("how", ["idle stop", "drain deadline", "server killed"])
def test_what_the_server_leaves_running_stops_with_it(tmp_path: Path, how: str) -> None:
    """A helper of Triton's (a hung backend stub, an engine core of a killed Triton) that
    ignores SIGTERM and outlives the server ends with it, however the server ended."""
    pod = Pod.create(tmp_path)
    helper = tmp_path / "helper.pid"
    pod.env["STANDIN_HELPER_PID_FILE"] = str(helper)
    pod.env["LLM_SERVING_DRAIN_SECONDS"] = "1"
    record = tmp_path / "requests.jsonl"
    pod.env["KSERVE_STANDIN_RECORD"] = str(record)
    pod.env["STANDIN_TOKEN_DELAY_SECONDS"] = "0.5"  # 15 s per request, past the deadline
    pod.start().wait_ready()
    assert wait_for_file(helper), pod.stderr()
    pid = int(helper.read_text())
    # The pod's marker finds the helper, whose parent is the server, not the entrypoint.
    assert pid in {p.pid for p in pod.leftover_processes(timeout=0)}
    threads: list[threading.Thread] = []
    if how == "drain deadline":
        threads = _traffic(pod.port("public_grpc"), {}, {})
        _wait_until_received(record)
    if how == "server killed":
        (triton,) = pod.leftover_servers()
        triton.kill()
        code, err = pod.wait_exit()
        assert code == ExitCode.SERVER_EXITED, err
    else:
        code, err = pod.terminate()
        expected = ExitCode.DRAIN_TIMEOUT if how == "drain deadline" else ExitCode.DRAINED
        assert code == expected, err
    for thread in threads:
        thread.join(timeout=30)
    left = pod.leftover_processes(timeout=15)
    assert left == [], f"{[p.cmdline() for p in left]} outlived the pod ({how})"
