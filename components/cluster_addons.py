"""``ClusterAddons``: the pinned Helm releases that model services need in a cluster."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from components.gateway import GATEWAY_PLUGIN
from components.gpu_node_group import GPU_RESOURCE, gpu_tolerations

__all__ = [
    "GATEWAY_CLASS",
    "GATEWAY_PORT",
    "PINNED_CHARTS",
    "PROMETHEUS_MIN_STORAGE_GIB",
    "PROMETHEUS_RETENTION",
    "STORAGE_CLASS",
    "ChartPin",
    "ClusterAddons",
    "ClusterAddonsArgs",
]

GATEWAY_CLASS = "envoy-gateway"
# The shared Gateway's one listener: plain HTTP, which carries gRPC as h2c too.
GATEWAY_PORT = 80
# What the Gateway API plugin changes: route weights, and its own state in a ConfigMap of the
# rollout's namespace. The chart's controller role grants neither.
GATEWAY_PLUGIN_RULES = [
    {
        "apiGroups": ["gateway.networking.k8s.io"],
        "resources": ["httproutes", "grpcroutes"],
        "verbs": ["get", "list", "watch", "update", "patch"],
    },
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["get", "list", "watch", "create", "update", "patch"],
    },
]

# `llm-serving versions gc` retires a version only when Prometheus covers its whole idle window
# (24h by default, plus 15m of coverage slack): two weeks covers that with margin, and a weekly
# window (--idle 7d) too.
PROMETHEUS_RETENTION = "15d"
# Below this, the WAL and head chunks (a few GiB at their two-hourly peak) leave little room for
# the blocks of the retention window.
PROMETHEUS_MIN_STORAGE_GIB = 20
# Prometheus deletes whole blocks, so size-based retention needs headroom: its storage docs
# recommend at most 80-85% of the volume.
_RETENTION_SIZE_SHARE = 0.8
# Ours, not "gp3": an adopted cluster may already hold a class of that name with other settings.
STORAGE_CLASS = "llm-serving-gp3"
_EBS_CSI_PROVISIONER = "ebs.csi.aws.com"


@dataclass(frozen=True)
class ChartPin:
    """One Helm chart at an exact version."""

    chart: str
    """Chart name, or an ``oci://`` reference."""
    version: str
    """Exact chart version (never a range)."""
    repo: str | None
    """Chart repository URL; ``None`` for ``oci://`` charts."""
    namespace: str
    """Namespace the release is installed into."""


FSX_CSI_DRIVER = ChartPin(
    "aws-fsx-csi-driver",
    "1.11.0",
    "https://kubernetes-sigs.github.io/aws-fsx-csi-driver",
    "kube-system",
)
NVIDIA_DEVICE_PLUGIN = ChartPin(
    "nvidia-device-plugin", "0.17.1", "https://nvidia.github.io/k8s-device-plugin", "nvidia"
)
ARGO_ROLLOUTS = ChartPin(
    "argo-rollouts", "2.37.6", "https://argoproj.github.io/argo-helm", "argo-rollouts"
)
ENVOY_GATEWAY = ChartPin(
    "oci://docker.io/envoyproxy/gateway-helm", "v1.4.0", None, "envoy-gateway-system"
)
KEDA = ChartPin("keda", "2.17.0", "https://kedacore.github.io/charts", "keda")
KUBE_PROMETHEUS_STACK = ChartPin(
    "kube-prometheus-stack",
    "75.4.0",
    "https://prometheus-community.github.io/helm-charts",
    "monitoring",
)

PINNED_CHARTS: tuple[ChartPin, ...] = (
    FSX_CSI_DRIVER,
    NVIDIA_DEVICE_PLUGIN,
    ARGO_ROLLOUTS,
    ENVOY_GATEWAY,
    KEDA,
    KUBE_PROMETHEUS_STACK,
)
"""Every chart the add-ons install, at its pinned version: the one place pins are recorded
(tests check each against its copy under ``reference/charts/<chart>-<version>/``)."""


@dataclass(frozen=True)
class ClusterAddonsArgs:
    """Inputs of the cluster add-ons; chart versions are pinned defaults."""

    device_plugin_node_selector: Mapping[str, str] | None
    """Nodes whose AMI lacks the NVIDIA device plugin; ``None`` installs none."""
    gateway_namespace: str
    """Namespace of the shared Gateway that model routes attach to."""
    prometheus_storage_gib: int
    """Size of Prometheus's volume (gp3, at least ``PROMETHEUS_MIN_STORAGE_GIB``); its
    retention size is 80% of it."""
    fsx_csi: ChartPin = FSX_CSI_DRIVER
    """FSx for Lustre CSI driver."""
    device_plugin: ChartPin = NVIDIA_DEVICE_PLUGIN
    """NVIDIA device plugin (AL2023 NVIDIA AMIs only)."""
    argo_rollouts: ChartPin = ARGO_ROLLOUTS
    """Argo Rollouts controller."""
    gateway_api_plugin_url: str = (
        "https://github.com/argoproj-labs/rollouts-plugin-trafficrouter-gatewayapi/"
        "releases/download/v0.4.0/gatewayapi-plugin-linux-amd64"
    )
    """Argo Rollouts' Gateway API traffic-router plugin binary."""
    envoy_gateway: ChartPin = ENVOY_GATEWAY
    """Envoy Gateway: the Gateway API implementation (installs the Gateway API CRDs)."""
    keda: ChartPin = KEDA
    """KEDA, for scaling on vLLM's queue length."""
    prometheus_stack: ChartPin = KUBE_PROMETHEUS_STACK
    """Prometheus operator, Prometheus, Alertmanager and Grafana."""
    extra_values: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Per-release values merged over ours, keyed by release name."""
    depends_on: Sequence[pulumi.Resource] = ()
    """What the Gateway needs first: its namespace."""
    nodes: Sequence[pulumi.Resource] = ()
    """Where the releases' pods run, created first: a created cluster's system node group
    (releases are atomic, so Helm fails them when their pods find no node)."""
    storage_driver: Sequence[pulumi.Resource] = ()
    """What provisions Prometheus's EBS volume, created first: a created cluster's EBS CSI
    add-on (an adopted cluster runs its own driver)."""


class ClusterAddons(pulumi.ComponentResource):
    """FSx CSI driver, device plugin, Argo Rollouts, Envoy Gateway, KEDA, Prometheus stack (on
    a gp3 volume of its own StorageClass)."""

    releases: dict[str, k8s.helm.v3.Release]
    gateway_name: str
    gateway_namespace: str
    gateway_port: int

    def __init__(
        self, name: str, args: ClusterAddonsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        if args.prometheus_storage_gib < PROMETHEUS_MIN_STORAGE_GIB:
            raise ValueError(
                f"prometheus_storage_gib: {args.prometheus_storage_gib} GiB is below the minimum "
                f"of {PROMETHEUS_MIN_STORAGE_GIB} GiB"
            )
        super().__init__("llm-serving:cluster_addons:ClusterAddons", name, None, opts)
        self._name = name
        self._args = args
        self.releases = {}
        # The CSI node plugin must run on GPU nodes too, or their pods cannot mount the cache.
        self._release("aws-fsx-csi-driver", args.fsx_csi, {"node": {"tolerateAllTaints": True}})
        if args.device_plugin_node_selector is not None:
            self._release(
                "nvidia-device-plugin",
                args.device_plugin,
                {
                    "nodeSelector": dict(args.device_plugin_node_selector),
                    "tolerations": gpu_tolerations(),
                },
            )
        # Chart 2.37.6 writes controller.trafficRouterPlugins as it is under the
        # argo-rollouts-config ConfigMap's data (2.37.8 adds the key itself): a map of strings
        # whose trafficRouterPlugins entry is the controller's YAML list. A list there fails the
        # atomic release and no Rollout controller runs.
        plugins = [{"name": GATEWAY_PLUGIN, "location": args.gateway_api_plugin_url}]
        config = {"trafficRouterPlugins": yaml.safe_dump(plugins, sort_keys=False)}
        rollouts = self._release(
            "argo-rollouts", args.argo_rollouts, {"controller": {"trafficRouterPlugins": config}}
        )
        self._grant_gateway_plugin(rollouts)
        envoy = self._release("envoy-gateway", args.envoy_gateway, {})
        # Our ScaledObjects use no TriggerAuthentication, so the operator needs no Secret
        # outside its own namespace (where it keeps its certificates).
        self._release(
            "keda", args.keda, {"permissions": {"operator": {"restrict": {"secret": True}}}}
        )
        storage_class = self._create_storage_class()
        self._release(
            "kube-prometheus-stack",
            args.prometheus_stack,
            {
                "prometheus": {"prometheusSpec": self._prometheus_spec()},
                "grafana": {"sidecar": {"dashboards": {"enabled": True, "searchNamespace": "ALL"}}},
            },
            after=[storage_class, *args.storage_driver],
        )
        self.gateway_name, self.gateway_namespace = self._create_gateway(envoy)
        self.gateway_port = GATEWAY_PORT
        self.register_outputs(
            {
                "releases": {k: r.status for k, r in self.releases.items()},
                "gateway": f"{self.gateway_namespace}/{self.gateway_name}",
                "gpu_resource": GPU_RESOURCE,
            }
        )

    def _prometheus_spec(self) -> dict[str, Any]:
        gib = self._args.prometheus_storage_gib
        return {
            # Pick up every ServiceMonitor and PrometheusRule, not only the chart's own.
            "serviceMonitorSelectorNilUsesHelmValues": False,
            "podMonitorSelectorNilUsesHelmValues": False,
            "ruleSelectorNilUsesHelmValues": False,
            "retention": PROMETHEUS_RETENTION,
            # Prometheus reads GB as 2^30 bytes.
            "retentionSize": f"{int(gib * _RETENTION_SIZE_SHARE)}GB",
            # A volume, not the chart's emptyDir: a restart (a node roll, an upgrade) keeps the
            # history that versions gc reads.
            "storageSpec": {
                "volumeClaimTemplate": {
                    "spec": {
                        "storageClassName": STORAGE_CLASS,
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": f"{gib}Gi"}},
                    }
                }
            },
        }

    def _create_storage_class(self) -> k8s.storage.v1.StorageClass:
        """Encrypted gp3 volumes of the EBS CSI driver, created in the zone of the pod that
        claims one (an EBS volume lives in one Availability Zone) and growable in place."""
        return k8s.storage.v1.StorageClass(
            f"{self._name}-gp3",
            metadata={"name": STORAGE_CLASS},
            provisioner=_EBS_CSI_PROVISIONER,
            parameters={"type": "gp3", "encrypted": "true"},
            volume_binding_mode="WaitForFirstConsumer",
            allow_volume_expansion=True,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _release(
        self,
        release: str,
        pin: ChartPin,
        values: Mapping[str, Any],
        after: Sequence[pulumi.Resource] = (),
    ) -> k8s.helm.v3.Release:
        merged = _merge(values, self._args.extra_values.get(release, {}))
        resource = k8s.helm.v3.Release(
            f"{self._name}-{release}",
            name=release,
            chart=pin.chart,
            version=pin.version,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=pin.repo) if pin.repo else None,
            namespace=pin.namespace,
            create_namespace=True,
            atomic=True,
            values=merged,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*self._args.nodes, *after]),
        )
        self.releases[release] = resource
        return resource

    def _grant_gateway_plugin(self, rollouts: k8s.helm.v3.Release) -> None:
        """Let the Argo Rollouts controller, which runs the plugin, set the routes' weights."""
        role = k8s.rbac.v1.ClusterRole(
            f"{self._name}-argo-rollouts-gateway-api",
            metadata={"name": "argo-rollouts-gateway-api-plugin"},
            rules=GATEWAY_PLUGIN_RULES,
            opts=pulumi.ResourceOptions(parent=self),
        )
        k8s.rbac.v1.ClusterRoleBinding(
            f"{self._name}-argo-rollouts-gateway-api",
            metadata={"name": "argo-rollouts-gateway-api-plugin"},
            role_ref={
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role.metadata.name,
            },
            # The chart's controller service account is named after the release.
            subjects=[
                {
                    "kind": "ServiceAccount",
                    "name": rollouts.name,
                    "namespace": self._args.argo_rollouts.namespace,
                }
            ],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[rollouts]),
        )

    def _create_gateway(self, envoy: k8s.helm.v3.Release) -> tuple[str, str]:
        # Children do not inherit a component's dependencies: each names them itself.
        after_envoy = pulumi.ResourceOptions(
            parent=self, depends_on=[envoy, *self._args.depends_on]
        )
        k8s.apiextensions.CustomResource(
            f"{self._name}-gateway-class",
            api_version="gateway.networking.k8s.io/v1",
            kind="GatewayClass",
            metadata={"name": GATEWAY_CLASS},
            spec={"controllerName": "gateway.envoyproxy.io/gatewayclass-controller"},
            opts=after_envoy,
        )
        name = "llm-serving"
        k8s.apiextensions.CustomResource(
            f"{self._name}-gateway",
            api_version="gateway.networking.k8s.io/v1",
            kind="Gateway",
            metadata={"name": name, "namespace": self._args.gateway_namespace},
            spec={
                "gatewayClassName": GATEWAY_CLASS,
                "listeners": [
                    {
                        "name": "http",
                        "protocol": "HTTP",
                        "port": GATEWAY_PORT,
                        "allowedRoutes": {"namespaces": {"from": "Same"}},
                    }
                ],
            },
            opts=after_envoy,
        )
        return name, self._args.gateway_namespace


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge Helm values: mappings merge, anything else in ``override`` wins."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged
