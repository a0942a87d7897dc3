"""VersionedModel under Pulumi's mocks: resources and outputs per version, and removing a version
from the configuration removes exactly its resources."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes_validate
import pulumi
import pytest

from components.gateway import GatewayRef
from components.versioned import (
    VersionedArgs,
    VersionedConfigError,
    VersionedModel,
    VersionSpec,
)
from policy.versions import check_versioned_age
from policy.workloads import check_gpu_pods_tolerate_taint, check_gpu_startup_probes
from tests.rollouts.harness import run_under_mocks
from tests.rollouts.mocks import RecordingMocks
from tests.rollouts.samples import pod_template


def version(v: str, weight: int | None = None, created_at: str | None = None) -> VersionSpec:
    return VersionSpec(
        version=v,
        pod_template=pod_template("ranker", v),
        replicas=2,
        route_weight=weight,
        created_at=created_at,
    )


def declare(*versions: VersionSpec, **overrides: Any) -> tuple[RecordingMocks, dict[str, Any]]:
    args = VersionedArgs(
        model_id="ranker",
        versions=versions,
        namespace="serving",
        gateway=GatewayRef(name="inference", namespace="gateway"),
        domain="models.example.com",
        **overrides,
    )
    mocks = RecordingMocks()

    def build() -> pulumi.Output:
        model = VersionedModel("ranker", args)
        return pulumi.Output.all(**model.endpoints)

    (endpoints,) = run_under_mocks(mocks, build)
    return mocks, endpoints


def test_each_version_gets_deployment_service_and_routes() -> None:
    mocks, endpoints = declare(version("v3", 10), version("v4", 90))
    names = sorted(d.name for d in mocks.declared if d.type.startswith("kubernetes:"))
    # Each GRPCRoute's bound is an Envoy Gateway BackendTrafficPolicy (*-grpcroute-timeout).
    assert names == [
        "ranker-shared-grpcroute",
        "ranker-shared-grpcroute-timeout",
        "ranker-shared-httproute",
        "ranker-v3-deployment",
        "ranker-v3-grpcroute",
        "ranker-v3-grpcroute-timeout",
        "ranker-v3-httproute",
        "ranker-v3-service",
        "ranker-v4-deployment",
        "ranker-v4-grpcroute",
        "ranker-v4-grpcroute-timeout",
        "ranker-v4-httproute",
        "ranker-v4-service",
    ]
    v3_route = next(d for d in mocks.declared if d.name == "ranker-v3-grpcroute")
    assert v3_route.inputs["spec"]["hostnames"] == ["v3.ranker.grpc.models.example.com"]
    v3_http = next(d for d in mocks.declared if d.name == "ranker-v3-httproute")
    assert v3_http.inputs["spec"]["hostnames"] == ["v3.ranker.models.example.com"]
    v3_service = next(d for d in mocks.declared if d.name == "ranker-v3-service")
    assert v3_route.inputs["spec"]["rules"][0]["backendRefs"] == [
        {"name": v3_service.inputs["metadata"]["name"], "port": 8001}
    ]
    shared = next(d for d in mocks.declared if d.name == "ranker-shared-httproute")
    assert [(r["port"], r["weight"]) for r in shared.inputs["spec"]["rules"][0]["backendRefs"]] == [
        (8080, 10),
        (8080, 90),
    ]
    assert shared.inputs["spec"]["hostnames"] == ["ranker.models.example.com"]
    assert endpoints["v4"] == {
        "grpc": "v4.ranker.grpc.models.example.com:443",
        "openai": "https://v4.ranker.models.example.com/v1",
        "metrics": "http://ranker-v4-service-x1y2z3.serving.svc:9400/metrics",
    }


@pytest.mark.parametrize(
    ("overrides", "deadline"), [({}, 2400), ({"startup_timeout_seconds": 60}, 660)]
)
def test_deployments_wait_as_long_as_a_gpu_pod_starts(
    overrides: dict[str, Any], deadline: int
) -> None:
    # Kubernetes' 600 s progress deadline and pulumi-kubernetes' 10-minute wait would fail
    # `pulumi up` while a healthy version still loads its weights.
    mocks, _ = declare(version("v3"), version("v4"), **overrides)
    for deployment in mocks.of_type(":Deployment"):
        assert deployment.inputs["spec"]["progressDeadlineSeconds"] == deadline
        annotations = deployment.inputs["metadata"]["annotations"]
        assert annotations["pulumi.com/timeoutSeconds"] == str(deadline)


def test_each_deployment_selects_only_its_version() -> None:
    mocks, _ = declare(version("v3"), version("v4"))
    for deployment in mocks.of_type(":Deployment"):
        spec = deployment.inputs["spec"]
        wanted = deployment.name.split("-")[1]
        assert spec["selector"]["matchLabels"] == {
            "llm-serving/model-id": "ranker",
            "llm-serving/model-version": wanted,
            "llm-serving/strategy": "versioned",
        }
        assert spec["template"]["metadata"]["labels"]["llm-serving/model-version"] == wanted
        assert (
            check_gpu_pods_tolerate_taint("kubernetes:apps/v1:Deployment", deployment.inputs) == []
        )
        assert check_gpu_startup_probes("kubernetes:apps/v1:Deployment", deployment.inputs) == []


def test_removing_a_version_removes_exactly_its_resources() -> None:
    before, _ = declare(version("v3", 10), version("v4", 90))
    after, endpoints = declare(version("v4", 100))
    names = {d.name for d in before.declared}
    remaining = {d.name for d in after.declared}
    assert names - remaining == {
        "ranker-v3-deployment",
        "ranker-v3-service",
        "ranker-v3-grpcroute",
        "ranker-v3-grpcroute-timeout",
        "ranker-v3-httproute",
    }
    assert remaining <= names
    assert set(endpoints) == {"v4"}


def test_old_non_newest_version_is_flagged_by_the_advisory_policy() -> None:
    old = (datetime.now(UTC) - timedelta(days=5)).isoformat()
    mocks, _ = declare(version("v3", created_at=old), version("v4", created_at=old))
    flagged = {
        d.name
        for d in mocks.of_type(":Service")
        if check_versioned_age(
            "kubernetes:core/v1:Service", d.inputs, idle=timedelta(hours=24), now=datetime.now(UTC)
        )
    }
    assert flagged == {"ranker-v3-service"}


@pytest.mark.parametrize(
    ("versions", "message"),
    [
        ((version("v3", 10), version("v4", 80)), "sum to 90"),
        ((version("v3"), version("V3")), "repeats a version"),
        ((), "versions is empty"),
        ((version("v3", 150),), "route_weight is 150"),
    ],
)
def test_bad_versions_name_the_field(versions: tuple[VersionSpec, ...], message: str) -> None:
    args = VersionedArgs(
        model_id="ranker",
        versions=versions,
        namespace="serving",
        gateway=GatewayRef(name="inference"),
        domain="models.example.com",
    )
    with pytest.raises(VersionedConfigError, match=message):
        VersionedModel("ranker", args)


def test_deployments_and_services_validate_against_the_kubernetes_schema() -> None:
    mocks, _ = declare(version("v3"), version("v4"))
    for declared, api_version, kind in (
        *((d, "apps/v1", "Deployment") for d in mocks.of_type(":Deployment")),
        *((d, "v1", "Service") for d in mocks.of_type(":Service")),
    ):
        body = {"apiVersion": api_version, "kind": kind, **declared.inputs}
        kubernetes_validate.validate(body, "1.33", strict=True)


def test_versions_served_by_model_services_get_routes_and_outputs_only() -> None:
    mocks, endpoints = declare(
        VersionSpec(version="v3", service_name="ranker-v3", route_weight=30),
        VersionSpec(version="v4", service_name="ranker-v4", route_weight=70),
    )
    kinds = sorted(d.type.rsplit(":", 1)[-1] for d in mocks.declared if "kubernetes" in d.type)
    assert kinds == ["BackendTrafficPolicy"] * 3 + ["GRPCRoute"] * 3 + ["HTTPRoute"] * 3
    shared = next(d for d in mocks.declared if d.name == "ranker-shared-grpcroute")
    assert shared.inputs["spec"]["rules"][0]["backendRefs"] == [
        {"name": "ranker-v3", "port": 8001, "weight": 30},
        {"name": "ranker-v4", "port": 8001, "weight": 70},
    ]
    assert endpoints["v3"]["metrics"] == "http://ranker-v3.serving.svc:9400/metrics"


def test_version_needs_exactly_one_workload_source() -> None:
    with pytest.raises(VersionedConfigError, match="exactly one of pod_template and service_name"):
        VersionedModel(
            "ranker",
            VersionedArgs(
                model_id="ranker",
                versions=(VersionSpec(version="v1"),),
                namespace="serving",
                gateway=GatewayRef(name="inference"),
                domain="models.example.com",
            ),
        )
