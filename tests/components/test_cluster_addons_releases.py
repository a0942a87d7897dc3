"""ClusterAddons: pinned releases, the CSI node plugin on GPU nodes, the Gateway, the plugin."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from components.cluster_addons import (
    ARGO_ROLLOUTS,
    GATEWAY_CLASS,
    ClusterAddons,
    ClusterAddonsArgs,
)
from components.gpu_node_group import gpu_tolerations
from stacks.kubernetes_objects import validate_object
from tests.components.declared import Declare

RELEASE = "kubernetes:helm.sh/v3:Release"
#: The pinned charts' files (shared/ beside the checkout).
CHARTS = Path(__file__).resolve().parents[3] / "shared" / "reference" / "charts"


def test_every_release_is_pinned_to_an_exact_version(declare: Declare) -> None:
    declared = declare(
        lambda: ClusterAddons(
            "addons",
            ClusterAddonsArgs(
                device_plugin_node_selector={"llm-serving/ami-family": "al2023"},
                gateway_namespace="serving",
                prometheus_storage_gib=50,
            ),
        )
    )
    releases = {r.inputs["name"]: r.inputs for r in declared.of_type(RELEASE)}
    assert set(releases) == {
        "aws-fsx-csi-driver",
        "nvidia-device-plugin",
        "argo-rollouts",
        "envoy-gateway",
        "keda",
        "kube-prometheus-stack",
    }
    for release in releases.values():
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", release["version"]), release
        assert release["chart"].startswith("oci://") or release["repositoryOpts"]["repo"]
    assert releases["aws-fsx-csi-driver"]["values"]["node"]["tolerateAllTaints"] is True
    plugin = releases["nvidia-device-plugin"]["values"]
    assert plugin["nodeSelector"] == {"llm-serving/ami-family": "al2023"}
    assert plugin["tolerations"] == gpu_tolerations()
    # The pinned chart writes this value as the argo-rollouts-config ConfigMap's data.
    data = releases["argo-rollouts"]["values"]["controller"]["trafficRouterPlugins"]
    assert all(isinstance(v, str) for v in data.values())
    routers = yaml.safe_load(data["trafficRouterPlugins"])
    assert [r["name"] for r in routers] == ["argoproj-labs/gatewayAPI"]
    assert routers[0]["location"].startswith("https://github.com/argoproj-labs/")
    spec = releases["kube-prometheus-stack"]["values"]["prometheus"]["prometheusSpec"]
    assert spec["serviceMonitorSelectorNilUsesHelmValues"] is False
    gateway = declared.one("kubernetes:gateway.networking.k8s.io/v1:Gateway").inputs
    assert gateway["spec"]["gatewayClassName"] == GATEWAY_CLASS
    assert gateway["metadata"]["namespace"] == "serving"
    envoy = next(r for r in declared.of_type(RELEASE) if r.inputs["name"] == "envoy-gateway")
    gateway_urn = declared.one("kubernetes:gateway.networking.k8s.io/v1:Gateway").dependencies
    assert envoy.urn in gateway_urn


def test_the_pinned_argo_rollouts_chart_writes_router_plugins_as_configmap_data() -> None:
    """The shape above is 2.37.6's: its template puts the value itself under ``data:``. A pin
    without its reference folder fails here, so a chart bump is checked against its template."""
    folder = CHARTS / f"argo-rollouts-{ARGO_ROLLOUTS.version}"
    template = (folder / "configmap-template.yaml").read_text()
    block = template[template.index("with .Values.controller.trafficRouterPlugins") :]
    assert block.splitlines()[1].strip() == "{{- toYaml . | nindent 2 }}"


def test_no_device_plugin_when_every_ami_brings_its_own(declare: Declare) -> None:
    declared = declare(
        lambda: ClusterAddons(
            "addons",
            ClusterAddonsArgs(
                device_plugin_node_selector=None,
                gateway_namespace="serving",
                prometheus_storage_gib=50,
                extra_values={"keda": {"resources": {"operator": {"limits": {"cpu": "1"}}}}},
            ),
        )
    )
    names = {r.inputs["name"] for r in declared.of_type(RELEASE)}
    assert "nvidia-device-plugin" not in names
    keda = next(r.inputs for r in declared.of_type(RELEASE) if r.inputs["name"] == "keda")
    assert keda["values"] == {
        "permissions": {"operator": {"restrict": {"secret": True}}},
        "resources": {"operator": {"limits": {"cpu": "1"}}},
    }


def test_argo_rollouts_controller_may_set_route_weights(declare: Declare) -> None:
    declared = declare(
        lambda: ClusterAddons(
            "addons",
            ClusterAddonsArgs(
                device_plugin_node_selector=None, gateway_namespace="s", prometheus_storage_gib=50
            ),
        )
    )
    role = declared.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole").inputs
    binding = declared.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding").inputs
    routes = next(r for r in role["rules"] if r["apiGroups"] == ["gateway.networking.k8s.io"])
    assert set(routes["resources"]) == {"httproutes", "grpcroutes"}
    assert {"get", "list", "watch", "update", "patch"} <= set(routes["verbs"])
    # The plugin keeps its state in a ConfigMap of the rollout's namespace.
    state = next(r for r in role["rules"] if r["resources"] == ["configmaps"])
    assert {"create", "update"} <= set(state["verbs"])
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "argo-rollouts", "namespace": "argo-rollouts"}
    ]
    for resource in (role, binding):
        assert validate_object(resource) == (True, None)
