"""ModelService's KEDA trigger: the query and metric type of each scaling metric, and what the
queries compute, evaluated by Prometheus itself (``promtool test rules``) on Triton-shaped
series."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.model_service import ModelService, ModelServiceArgs, RolloutWorkload
from components.model_service.args import ScalingTrigger
from components.model_service.scaling import scaling_query
from components.model_service.service import SCALE_DOWN_WINDOW_S
from tests.components.declared import Declare

SCALED_OBJECT = "kubernetes:keda.sh/v1alpha1:ScaledObject"
KEDA_CRD = Path(__file__).resolve().parents[3] / "shared/reference/crds/keda.sh_scaledobjects.yaml"
ONE_VERSION = 'model_id="fraud",model_version="v1"'


def _args(**overrides: Any) -> ModelServiceArgs:
    values: dict[str, Any] = {
        "model_id": "fraud",
        "version": "v1",
        "namespace": "serving",
        "image": "repo/serving:1",
        "serving_mode": "standalone",
        "bucket_name": "models-usw2",
        "oidc_provider_arn": "arn:aws:iam::1:oidc-provider/oidc.example/id/X",
        "oidc_issuer": "oidc.example/id/X",
        "cache_claim_name": "cache-read-only",
        "node_group": "r-cpu",
        "gpus": 0,
        "cpu": 2,
        "memory_gib": 4,
        "replicas": 1,
        "max_replicas": 4,
    }
    values.update(overrides)
    return ModelServiceArgs(**values)


@pytest.mark.parametrize(
    ("metric", "metric_type", "query"),
    [
        ("queue_size", "AverageValue", f"sum(vllm:num_requests_waiting{{{ONE_VERSION}}})"),
        (
            "queue_time_us",
            "Value",
            f"(sum(rate(nv_inference_queue_duration_us{{{ONE_VERSION}}}[1m])) / "
            f"(sum(rate(nv_inference_request_success{{{ONE_VERSION}}}[1m])) > 0)) or vector(0)",
        ),
        ("inference_rate", "AverageValue", f"sum(rate(nv_inference_count{{{ONE_VERSION}}}[1m]))"),
    ],
)
def test_each_metric_has_its_query_and_metric_type(
    declare: Declare, metric: str, metric_type: str, query: str
) -> None:
    args = _args(scaling=ScalingTrigger(metric=metric, target=250))
    declared = declare(lambda: ModelService("s", args))
    (trigger,) = declared.one(SCALED_OBJECT).inputs["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == metric_type
    assert trigger["metadata"]["query"] == query
    assert trigger["metadata"]["threshold"] == "250"


def test_a_rollout_scales_on_both_colours_versions(declare: Declare) -> None:
    args = _args(scaling=ScalingTrigger("inference_rate", 100), rollout=RolloutWorkload())
    declared = declare(lambda: ModelService("s", args))
    spec = declared.one(SCALED_OBJECT).inputs["spec"]
    assert spec["scaleTargetRef"]["kind"] == "Rollout"
    assert spec["triggers"][0]["metadata"]["query"] == (
        'sum(rate(nv_inference_count{model_id="fraud"}[1m]))'
    )


def test_the_hpa_scales_down_as_slowly_as_kedas_cooldown(declare: Declare) -> None:
    """KEDA's cooldownPeriod only times scaling to zero: above ``minReplicaCount`` the HPA's own
    scale-down window applies, 300 s unless the ScaledObject sets it."""
    declared = declare(lambda: ModelService("s", _args(replicas=1, max_replicas=4)))
    spec = declared.one(SCALED_OBJECT).inputs["spec"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    window = behavior["scaleDown"]["stabilizationWindowSeconds"]
    assert window == spec["cooldownPeriod"] == SCALE_DOWN_WINDOW_S
    # The HPA refuses a longer window, and KEDA then creates no HPA at all.
    assert 300 < window <= 3600
    schema = yaml.safe_load(KEDA_CRD.read_text())["spec"]["versions"][0]["schema"]
    advanced = schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["advanced"]
    hpa = advanced["properties"]["horizontalPodAutoscalerConfig"]["properties"]
    scale_down = hpa["behavior"]["properties"]["scaleDown"]["properties"]
    assert "stabilizationWindowSeconds" in scale_down


def _series(name: str, pod: str, step: int, model: str = "fraud") -> dict[str, str]:
    """A counter of one pod rising by ``step`` every 15 s scrape for 3 minutes."""
    labels = f'model_id="{model}",model_version="v1",pod="{pod}"'
    return {"series": f"{name}{{{labels}}}", "values": f"0+{step}x12"}


def _expr_test(metric: str, value: float) -> dict[str, Any]:
    return {
        "expr": scaling_query(metric, ONE_VERSION),
        "eval_time": "2m",
        "exp_samples": [{"labels": "{}", "value": value}],
    }


def _promtool(tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "scaling.test.yaml").write_text(
        yaml.safe_dump({"rule_files": [], "evaluation_interval": "15s", "tests": tests})
    )
    return subprocess.run(
        ["promtool", "test", "rules", "scaling.test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus)")
def test_prometheus_computes_queue_time_per_request_and_inference_rate(tmp_path: Path) -> None:
    busy = [
        # Pod a: 3 requests and 60 ms of queueing per scrape; pod b: 9 requests, no queueing.
        _series("nv_inference_queue_duration_us", "a", 60000),
        _series("nv_inference_request_success", "a", 3),
        _series("nv_inference_queue_duration_us", "b", 0),
        _series("nv_inference_request_success", "b", 9),
        # 30 inferences (batched requests count each item) per scrape on each pod.
        _series("nv_inference_count", "a", 30),
        _series("nv_inference_count", "b", 30),
        # Another model's series are not this model's load.
        _series("nv_inference_queue_duration_us", "c", 10**9, model="other"),
        _series("nv_inference_request_success", "c", 1, model="other"),
        _series("nv_inference_count", "c", 10**6, model="other"),
    ]
    idle = [
        {"series": f'{name}{{{ONE_VERSION},pod="a"}}', "values": "5+0x12"}
        for name in ("nv_inference_queue_duration_us", "nv_inference_request_success")
    ]
    tests = [
        # Per request over both pods (60 ms / 12 requests), not the mean of the pods' averages
        # (10 ms).
        {
            "interval": "15s",
            "input_series": busy,
            "promql_expr_test": [
                _expr_test("queue_time_us", 5000),
                _expr_test("inference_rate", 4),
            ],
        },
        # No requests in the window: no queue (0), not NaN, which KEDA cannot scale on.
        {
            "interval": "15s",
            "input_series": idle,
            "promql_expr_test": [
                _expr_test("queue_time_us", 0),
            ],
        },
    ]
    out = _promtool(tmp_path, tests)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus)")
def test_the_promtool_check_can_fail(tmp_path: Path) -> None:
    series = [_series("nv_inference_count", "a", 30)]
    tests = [
        {
            "interval": "15s",
            "input_series": series,
            "promql_expr_test": [
                _expr_test("inference_rate", 3),
            ],
        }
    ]
    out = _promtool(tmp_path, tests)
    assert out.returncode != 0 and "FAILED" in out.stdout + out.stderr
