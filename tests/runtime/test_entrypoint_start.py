"""The real entrypoint against the tritonserver stand-in: gate, stages, metrics, health."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from runtime.entrypoint import STAGES
from runtime.serving_backend import BACKEND_NAME
from tests.runtime.pod import Pod, http_body, http_status, infer, model_ready, port_refuses


def test_port_closed_until_ready_then_serves_and_drains(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path, light_matrix=False)  # the real matrix: vLLM modules probed
    stale = [pod.root / "prom" / n for n in ("counter_4242.db", "histogram_4242.db")]
    for path in stale:
        path.write_bytes(b"\x00" * 64)
    pod.env["KSERVE_STANDIN_LOAD_SECONDS"] = "2"
    pod.start()
    public = pod.port("public_grpc")
    saw_closed_while_starting = False
    deadline = time.monotonic() + 90
    while http_status(pod.port("health"), "/readyz") != 200:
        assert pod.process is not None and pod.process.poll() is None, pod.stderr()
        assert time.monotonic() < deadline, pod.stderr()
        if http_status(pod.port("health"), "/livez") == 200:
            if port_refuses(public):
                saw_closed_while_starting = True
            else:  # Triton bound it itself: only once the model had loaded
                assert model_ready(public), "the public port accepted before the model was ready"
        time.sleep(0.05)
    assert saw_closed_while_starting
    assert not port_refuses(public)
    assert infer(public, "the quick brown fox") != ""
    assert not any(path.exists() for path in stale)

    metrics = http_body(pod.port("health"), "/metrics")
    for stage in STAGES:
        assert f'startup_stage_seconds{{stage="{stage}"}}' in metrics
    # The same gauge reaches the metrics proxy through the multiprocess folder.
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(pod.root / "prom"))
    samples = {s.labels["stage"] for m in registry.collect() for s in m.samples}
    assert samples == set(STAGES)

    repository = pod.root / "work" / "model_repository" / "toy"
    assert f'backend: "{BACKEND_NAME}"' in (repository / "config.pbtxt").read_text()
    code, err = pod.terminate()
    assert code == 0, err
    for number, stage in enumerate(STAGES, start=1):
        assert f"stage {number}/8 {stage} done in" in err
    assert "plugins registered: vllm.logits_processors:toy" in err
    assert "removed 2 stale entries" in err
    assert port_refuses(public)


def test_readyz_turns_503_and_port_closes_when_triton_dies(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path).start()
    pod.wait_ready()
    assert pod.process is not None
    (triton,) = pod.leftover_servers()
    triton.kill()
    code = pod.process.wait(timeout=30)
    err = pod.stderr()
    assert code == 20, err
    line = f"Triton (pid {triton.pid}) was killed by SIGKILL while serving"
    assert line in err and "; fix: " in err, err
    assert port_refuses(pod.port("public_grpc"))


def _readyz_once(pod: Pod, status: int) -> int | None:
    """Poll ``/readyz`` until it answers ``status`` (the hang guard returns the last answer)."""
    deadline = time.monotonic() + 30
    answer = http_status(pod.port("health"), "/readyz")
    while answer != status and time.monotonic() < deadline:
        time.sleep(0.05)
        answer = http_status(pod.port("health"), "/readyz")
    return answer


def test_readyz_follows_the_model_while_serving(tmp_path: Path) -> None:
    unready = tmp_path / "unready"
    pod = Pod.create(tmp_path)
    pod.env.update(
        {
            "STANDIN_UNREADY_WHILE_FILE": str(unready),
            "LLM_SERVING_READINESS_POLL_SECONDS": "0.2",
        }
    )
    pod.start().wait_ready()
    seen = [_readyz_once(pod, 200)]
    unready.touch()  # the model's health check fails until the file goes
    seen.append(_readyz_once(pod, 503))
    assert not port_refuses(pod.port("public_grpc"))  # the gate stays open meanwhile
    unready.unlink()
    seen.append(_readyz_once(pod, 200))
    assert seen == [200, 503, 200]
    code, err = pod.terminate()
    assert code == 0, err
    assert "model toy is no longer ready" in err and "model toy is ready again" in err
