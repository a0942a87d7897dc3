"""VersionedModel's labels: every object of a version carries the label values ModelService
gives its pods (``dns_label``), which the API server accepts for any version the stack
configuration does (``v5_``, ``V6.1``, ``2026-11-15``)."""

from __future__ import annotations

from typing import Any

import pytest

from components.gateway import GatewayRef
from components.versioned import VersionedArgs, VersionedConfigError, VersionedModel, VersionSpec
from contracts.labels import MODEL_ID_LABEL, MODEL_VERSION_LABEL
from contracts.naming import dns_label
from stacks.plan_checks import CHECKS
from tests.components.declared import Declare

VERSIONS = ("2026-11-15", "v5_", "V6.1")
ROUTE_KINDS = (
    "kubernetes:gateway.networking.k8s.io/v1:GRPCRoute",
    "kubernetes:gateway.networking.k8s.io/v1:HTTPRoute",
)


def _template(version: str) -> dict[str, Any]:
    """A pod template labelled as ``build_pod_template`` labels one."""
    return {
        "metadata": {
            "labels": {
                "app.kubernetes.io/name": "llm-serving",
                MODEL_ID_LABEL: "ranker",
                MODEL_VERSION_LABEL: dns_label(version),
            }
        },
        "spec": {"containers": [{"name": "serving", "image": "serving:1"}]},
    }


def _model(*specs: VersionSpec) -> None:
    VersionedModel(
        "ranker",
        VersionedArgs(
            model_id="ranker",
            versions=specs,
            namespace="serving",
            gateway=GatewayRef(name="inference", namespace="gateway"),
            domain="models.example.com",
        ),
    )


def test_routes_label_each_version_as_its_model_service_does(declare: Declare) -> None:
    declared = declare(lambda: _model(*(VersionSpec(v, service_name=f"s-{v}") for v in VERSIONS)))
    assert CHECKS["label syntax"](declared.run) == []
    routes = [r for r in declared.run.resources if r.type in ROUTE_KINDS]
    by_backend = {
        r.inputs["spec"]["rules"][0]["backendRefs"][0]["name"]: r.inputs["metadata"]["labels"]
        for r in routes
        if "shared" not in r.name
    }
    assert {name: labels[MODEL_VERSION_LABEL] for name, labels in by_backend.items()} == {
        f"s-{v}": dns_label(v) for v in VERSIONS
    }


def test_a_versions_own_workload_selects_its_pods_by_valid_labels(declare: Declare) -> None:
    declared = declare(
        lambda: _model(*(VersionSpec(v, pod_template=_template(v)) for v in VERSIONS))
    )
    assert CHECKS["label syntax"](declared.run) == []
    for version in VERSIONS:
        prefix = f"ranker-{dns_label(version)}"
        deployment = declared.one("kubernetes:apps/v1:Deployment", prefix).inputs["spec"]
        service = declared.one("kubernetes:core/v1:Service", prefix).inputs["spec"]
        pod_labels = deployment["template"]["metadata"]["labels"]
        assert deployment["selector"]["matchLabels"].items() <= pod_labels.items()
        assert service["selector"].items() <= pod_labels.items()
        assert pod_labels[MODEL_VERSION_LABEL] == dns_label(version)


def test_versions_with_one_label_value_are_refused() -> None:
    # Distinct hostnames (v1--0, v1-0) but one label value, so one selector for two versions.
    with pytest.raises(VersionedConfigError, match=r"versions\[1\] 'v1-0' repeats a version"):
        _model(VersionSpec("v1..0", service_name="a"), VersionSpec("v1-0", service_name="b"))
