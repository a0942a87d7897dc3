"""Each analysis step of the rendered Rollout, run against a real Prometheus the way Argo runs it:
the step's templates and args as declared, colours resolved to recorded pod-template hashes,
``initialDelay`` then ``count`` measurements ``interval`` apart, judged against ``failureLimit``.

Two situations that a healthy canary must pass and a failing one must not: the analysis after
the last weight shift, when the stable colour takes no traffic (and dynamicStableScale has
scaled it to 0); and a rollout of a new pod with the same model version, when the stable colour
already serves the version the configuration lists last.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.rollouts.harness import deploy, make_args
from tests.rollouts.mocks import RecordingMocks
from tests.rollouts.prometheus import PrometheusServer, Recording, argo_condition, serve

MODEL = "llama"
V_OLD, V_NEW = "2026-10-01", "2026-11-15"
BUCKETS = ("0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "+Inf")
FAST = (0.1, 0.3, 0.7, 0.97, 0.995, 1.0, 1.0, 1.0)  # p95 about 0.48 s

END = float(int(time.time()) - 60)
START = END - 30 * 60
SWITCH = END - 12 * 60  # the final setWeight: 100
STEP = 15.0

# Final shift: the old colour serves V_OLD until SWITCH, then has no pods left.
OLD_STABLE = {"colour": "6d4f7c9b8", "version": V_OLD}
FINAL_HEALTHY = {"colour": "7f5c8d2a1", "version": V_NEW}
FINAL_FAILING = {"colour": "5b9e3f7c2", "version": V_NEW}
# New image, same version: the stable colour already serves V_NEW.
NEW_STABLE = {"colour": "3c8a1f6d0", "version": V_NEW}
POD_HEALTHY = {"colour": "8e2d7b4a9", "version": V_NEW}
POD_FAILING = {"colour": "9a4c2e8f1", "version": V_NEW}


def record(
    recording: Recording,
    side: dict[str, str],
    before: tuple[float, float],
    after: tuple[float, float],
    stop_at: float | None = None,
) -> None:
    """Counters of one colour: (successes, failures) per second before and after SWITCH, and no
    samples after ``stop_at`` (its pods are gone)."""
    labels = {"model": MODEL, "version": "1", "model_id": MODEL}
    labels |= {"model_version": side["version"], "colour": side["colour"]}

    def series(index: int, fraction: float = 1.0) -> list[tuple[float, float]]:
        samples, t, value = [], START, 0.0
        while t <= END and (stop_at is None or t <= stop_at):
            samples.append((t, value))
            value += (before if t < SWITCH else after)[index] * fraction * STEP
            t += STEP
        return samples

    recording.add("nv_inference_request_success", labels, series(0))
    recording.add("nv_inference_request_failure", labels | {"reason": "OTHER"}, series(1))
    for le, fraction in zip(BUCKETS, FAST, strict=True):
        recording.add(
            "vllm:time_to_first_token_seconds_bucket", labels | {"le": le}, series(0, fraction)
        )


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory):
    recording = Recording()
    # 50 % each before the final shift, then everything on the canary.
    record(recording, OLD_STABLE, (10.0, 0.005), (0.0, 0.0), stop_at=SWITCH + 30)
    record(recording, FINAL_HEALTHY, (10.0, 0.005), (20.0, 0.01))
    record(recording, FINAL_FAILING, (10.0, 0.005), (20.0, 2.0))
    # 90 % / 10 % at the first step of a pod-only rollout.
    record(recording, NEW_STABLE, (18.0, 0.009), (18.0, 0.009))
    record(recording, POD_HEALTHY, (2.0, 0.001), (2.0, 0.001))
    record(recording, POD_FAILING, (2.0, 0.2), (2.0, 0.2))
    with serve(recording, Path(tmp_path_factory.mktemp("prometheus"))) as server:
        yield server


def rendered(**overrides: Any) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """The Rollout's steps and each AnalysisTemplate's metrics by template name."""
    mocks = RecordingMocks()
    deploy(mocks, make_args(**overrides))
    steps = mocks.one(":Rollout").inputs["spec"]["strategy"]["canary"]["steps"]
    templates = {
        t.inputs["metadata"]["name"]: t.inputs["spec"] for t in mocks.of_type(":AnalysisTemplate")
    }
    return steps, templates


def _seconds(duration: str) -> int:
    match = re.fullmatch(r"(\d+)([sm])", duration)
    assert match, duration
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


def run_step(
    server: PrometheusServer,
    step: dict[str, Any],
    templates: dict[str, dict[str, Any]],
    colours: dict[str, str],
    started: float,
) -> dict[str, bool]:
    """Whether each metric of an analysis step passes, by metric name."""
    analysis = step["analysis"]
    values = {a["name"]: a["value"] for a in analysis["args"] if "value" in a}
    for arg in analysis["args"]:
        if "valueFrom" in arg:
            values[arg["name"]] = colours[arg["valueFrom"]["podTemplateHashValue"]]
    verdicts = {}
    for ref in analysis["templates"]:
        spec = templates[ref["templateName"]]
        declared = {a["name"] for a in spec["args"]}
        assert declared <= set(values), (
            f"{ref['templateName']}: unresolved {declared - set(values)}"
        )
        for metric in spec["metrics"]:
            query = metric["provider"]["prometheus"]["query"]
            for name in declared:
                query = query.replace(f"{{{{args.{name}}}}}", values[name])
            assert "{{" not in query, query
            failed = 0
            for n in range(int(metric["count"])):
                at = started + _seconds(metric["initialDelay"]) + n * _seconds(metric["interval"])
                result = server.vector(query, at)
                # An empty result is an error in Argo; count it against the metric as well.
                if not result or not argo_condition(metric["successCondition"], result):
                    failed += 1
            verdicts[metric["name"]] = failed <= metric["failureLimit"]
    return verdicts


def test_healthy_canary_passes_the_analysis_after_the_final_shift(prometheus) -> None:
    steps, templates = rendered()
    assert steps[-2] == {"setWeight": 100}
    colours = {"Latest": FINAL_HEALTHY["colour"], "Stable": OLD_STABLE["colour"]}
    verdicts = run_step(prometheus, steps[-1], templates, colours, started=SWITCH)
    assert verdicts == {"success-ratio": True, "ttft-p95": True}


def test_failing_canary_still_fails_the_analysis_after_the_final_shift(prometheus) -> None:
    steps, templates = rendered()
    colours = {"Latest": FINAL_FAILING["colour"], "Stable": OLD_STABLE["colour"]}
    verdicts = run_step(prometheus, steps[-1], templates, colours, started=SWITCH)
    assert verdicts["success-ratio"] is False


def test_the_step_before_the_final_shift_still_compares_with_stable(prometheus) -> None:
    steps, templates = rendered()
    assert steps[-4] == {"setWeight": 50}
    colours = {"Latest": FINAL_HEALTHY["colour"], "Stable": OLD_STABLE["colour"]}
    started = SWITCH - 10 * 60
    healthy = run_step(prometheus, steps[-3], templates, colours, started=started)
    assert healthy == dict.fromkeys(
        ("success-ratio", "ttft-p95", "success-ratio-vs-stable", "ttft-p95-vs-stable"), True
    )


@pytest.mark.parametrize(
    ("canary", "expected"),
    [
        (
            POD_HEALTHY,
            {
                "success-ratio": True,
                "ttft-p95": True,
                "success-ratio-vs-stable": True,
                "ttft-p95-vs-stable": True,
            },
        ),
        (
            POD_FAILING,
            {
                "success-ratio": False,
                "ttft-p95": True,
                "success-ratio-vs-stable": False,
                "ttft-p95-vs-stable": True,
            },
        ),
    ],
)
def test_pod_only_rollout_compares_with_what_stable_serves(
    prometheus, canary: dict[str, str], expected: dict[str, bool]
) -> None:
    # What RegionPlatform renders for versions [V_OLD, V_NEW] once the rollout to V_NEW is done.
    steps, templates = rendered(version=V_NEW)
    assert steps[0] == {"setWeight": 10}
    colours = {"Latest": canary["colour"], "Stable": NEW_STABLE["colour"]}
    verdicts = run_step(prometheus, steps[1], templates, colours, started=START + 5 * 60)
    assert verdicts == expected
