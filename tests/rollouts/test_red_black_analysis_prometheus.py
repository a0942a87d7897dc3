"""The analysis the RedBlackRollout renders, evaluated against a real Prometheus holding a
healthy stable colour, a healthy canary colour and a failing canary colour.

Queries come from the declared AnalysisTemplates with Argo's ``{{args.*}}`` filled the way the
Rollout's analysis step fills them; each successCondition is evaluated on the result vector as
Argo's Prometheus provider hands it over.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.rollouts.harness import deploy, make_args
from tests.rollouts.mocks import RecordingMocks
from tests.rollouts.prometheus import PrometheusServer, Recording, argo_condition, serve

MODEL = "llama"
STABLE = {"colour": "6d4f7c9b8", "version": "2026-10-01"}
HEALTHY = {"colour": "7f5c8d2a1", "version": "2026-11-15"}
FAILING = {"colour": "5b9e3f7c2", "version": "2026-11-15"}
CANCELLING = {"colour": "3a8d6e1f4", "version": "2026-11-15"}
BUCKETS = ("0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "+Inf")
FAST = (0.1, 0.3, 0.7, 0.97, 0.995, 1.0, 1.0, 1.0)  # p95 about 0.48 s
SLOW = (0.0, 0.05, 0.2, 0.5, 0.8, 0.97, 1.0, 1.0)  # p95 about 2.3 s: under 2.5 s, 4.8x stable

END = float(int(time.time()) - 60)
START = END - 20 * 60
STEP = 15.0


def record(
    recording: Recording, side: dict[str, str], ok: float, failed: float, cdf, cancelled=0.0
) -> None:
    labels = {"model": MODEL, "version": "1", "model_id": MODEL}
    labels |= {"model_version": side["version"], "colour": side["colour"]}
    recording.counter("nv_inference_request_success", labels, ok, START, END, STEP)
    recording.counter(
        "nv_inference_request_failure", labels | {"reason": "OTHER"}, failed, START, END, STEP
    )
    recording.counter(
        "nv_inference_request_failure",
        labels | {"reason": "CANCELED"},
        cancelled,
        START,
        END,
        STEP,
    )
    for le, fraction in zip(BUCKETS, cdf, strict=True):
        recording.counter(
            "vllm:time_to_first_token_seconds_bucket",
            labels | {"le": le},
            ok * fraction,
            START,
            END,
            STEP,
        )


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory):
    recording = Recording()
    record(recording, STABLE, ok=20.0, failed=0.01, cdf=FAST)
    record(recording, HEALTHY, ok=5.0, failed=0.002, cdf=FAST)
    record(recording, FAILING, ok=5.0, failed=0.5, cdf=SLOW)
    # A fifth of its requests closed by their clients (a stop button): no fault of the version.
    record(recording, CANCELLING, ok=5.0, failed=0.002, cdf=FAST, cancelled=1.25)
    with serve(recording, Path(tmp_path_factory.mktemp("prometheus"))) as server:
        yield server


@pytest.fixture(scope="module")
def metrics() -> list[dict]:
    mocks = RecordingMocks()
    deploy(mocks, make_args())
    return [m for t in mocks.of_type(":AnalysisTemplate") for m in t.inputs["spec"]["metrics"]]


def fill(query: str, canary: dict[str, str]) -> str:
    values = {
        "model_id": MODEL,
        "canary-colour": canary["colour"],
        "canary-version": canary["version"],
        "stable-colour": STABLE["colour"],
    }
    for name, value in values.items():
        query = query.replace(f"{{{{args.{name}}}}}", value)
    assert "{{" not in query, query
    return query


def verdicts(server: PrometheusServer, metrics: list[dict], canary: dict) -> dict[str, bool]:
    return {
        m["name"]: argo_condition(
            m["successCondition"],
            server.vector(fill(m["provider"]["prometheus"]["query"], canary), END),
        )
        for m in metrics
    }


def test_healthy_colour_passes_every_metric(prometheus: PrometheusServer, metrics) -> None:
    assert verdicts(prometheus, metrics, HEALTHY) == {
        "success-ratio": True,
        "success-ratio-vs-stable": True,
        "ttft-p95": True,
        "ttft-p95-vs-stable": True,
    }


def test_requests_cancelled_by_clients_do_not_fail_the_step(
    prometheus: PrometheusServer, metrics
) -> None:
    assert all(verdicts(prometheus, metrics, CANCELLING).values())


def test_failing_colour_fails_the_step(prometheus: PrometheusServer, metrics) -> None:
    # The slow colour stays under the absolute TTFT bound: only the comparison catches it.
    assert verdicts(prometheus, metrics, FAILING) == {
        "success-ratio": False,
        "success-ratio-vs-stable": False,
        "ttft-p95": True,
        "ttft-p95-vs-stable": False,
    }


def test_colour_without_traffic_fails_rather_than_passes(prometheus, metrics) -> None:
    ghost = {"colour": "0000000", "version": "2026-11-15"}
    for metric in metrics:
        query = fill(metric["provider"]["prometheus"]["query"], ghost)
        result = prometheus.vector(query, END)
        if result:
            assert argo_condition(metric["successCondition"], result) is False, metric["name"]
