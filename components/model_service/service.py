"""``ModelService``: Triton serving one model version (vLLM for LLMs, Triton's CPU backends for
models without GPUs), with its sidecar, IRSA and scaling.

The pod itself (contract 5) is :func:`components.model_service.pod.build_pod_template`; this
module adds what surrounds it: the workload, Service, PodDisruptionBudget, scrape configuration,
the IRSA role and the optional KEDA scaler. A rollout component that builds its own workload
around the pod template is named in :attr:`ModelServiceArgs.rollout`.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.iam import irsa_trust_policy, role_name
from components.model_service.args import GRPC_PORT, METRICS_PORT, OPENAI_PORT, ModelServiceArgs
from components.model_service.pod import build_pod_template, pod_selector
from components.model_service.scaling import prometheus_trigger

__all__ = ["SCALE_DOWN_WINDOW_S", "ModelService"]

# How long KEDA's load must stay low before a pod goes (the HPA allows at most 3600 s).
SCALE_DOWN_WINDOW_S = 900


class ModelService(pulumi.ComponentResource):
    """Serving pods, Service, PDB, scrape config, IRSA role and optional KEDA scaling."""

    service_name: str | None
    grpc_endpoint: pulumi.Output[str] | None
    openai_endpoint: pulumi.Output[str | None] | None
    metrics_endpoint: pulumi.Output[str] | None
    role_arn: pulumi.Output[str]

    def __init__(
        self, name: str, args: ModelServiceArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        template = build_pod_template(args)
        super().__init__("llm-serving:model_service:ModelService", name, None, opts)
        self._name = name
        self._args = args
        # Everything namespaced waits for what the caller names (namespace, materialize Job).
        child = pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on))
        role = self._create_role()
        metadata = {"name": args.name, "namespace": args.namespace, "labels": args.labels}
        account = k8s.core.v1.ServiceAccount(
            f"{name}-sa",
            metadata={**metadata, "annotations": {"eks.amazonaws.com/role-arn": role.arn}},
            opts=child,
        )
        workload = None
        if args.rollout is None:
            workload = k8s.apps.v1.Deployment(
                f"{name}-deployment",
                metadata=metadata,
                spec={
                    "replicas": args.replicas,
                    "selector": {"matchLabels": pod_selector(args)},
                    "progressDeadlineSeconds": args.startup_timeout_s + 600,
                    # No capacity is given up during an update: a new pod must be ready first.
                    "strategy": {
                        "type": "RollingUpdate",
                        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
                    },
                    "template": template,
                },
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=[account, *args.depends_on],
                    custom_timeouts=pulumi.CustomTimeouts(
                        create=f"{args.startup_timeout_s + 600}s",
                        update=f"{args.startup_timeout_s + 600}s",
                    ),
                    # KEDA owns the replica count once scaling is on.
                    ignore_changes=["spec.replicas"] if args.max_replicas is not None else None,
                ),
            )
        k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata=metadata,
            spec={"maxUnavailable": 1, "selector": {"matchLabels": pod_selector(args)}},
            opts=child,
        )
        self.service_name = None
        self.grpc_endpoint = self.openai_endpoint = self.metrics_endpoint = None
        if args.rollout is None:
            self._create_service(metadata, child)
        self._create_scrape_config(metadata)
        if args.max_replicas is not None:
            self._create_scaler(metadata, workload)
        self.role_arn = role.arn
        self.register_outputs(
            {
                "service_name": self.service_name,
                "grpc_endpoint": self.grpc_endpoint,
                "openai_endpoint": self.openai_endpoint,
                "metrics_endpoint": self.metrics_endpoint,
                "role_arn": self.role_arn,
            }
        )

    def _create_service(self, metadata: dict[str, Any], opts: pulumi.ResourceOptions) -> None:
        args = self._args
        service = k8s.core.v1.Service(
            f"{self._name}-service",
            metadata={**metadata, "annotations": dict(args.service_annotations)},
            spec={
                "selector": pod_selector(args),
                "ports": pulumi.Output.from_input(args.serving_mode).apply(_service_ports),
            },
            opts=opts,
        )
        host = f"{args.name}.{args.namespace}.svc.cluster.local"
        self.service_name = args.name
        self.grpc_endpoint = service.metadata.apply(lambda _: f"{host}:{GRPC_PORT}")
        self.openai_endpoint = pulumi.Output.from_input(args.serving_mode).apply(
            lambda mode: f"http://{host}:{OPENAI_PORT}/v1" if mode == "embedded" else None
        )
        self.metrics_endpoint = service.metadata.apply(
            lambda _: f"http://{host}:{METRICS_PORT}/metrics"
        )

    def _create_role(self) -> aws.iam.Role:
        args = self._args
        trust = irsa_trust_policy(
            args.oidc_provider_arn, args.oidc_issuer, args.namespace, args.name
        )
        role = aws.iam.Role(
            f"{self._name}-role",
            name=role_name(f"{self._name}-role"),
            assume_role_policy=trust,
            opts=pulumi.ResourceOptions(parent=self),
        )
        prefixes = [f"models/{args.model_id}/{v}/" for v in (args.version, *args.also_reads)]
        aws.iam.RolePolicy(
            f"{self._name}-read-model",
            role=role.id,
            policy=pulumi.Output.from_input(args.bucket_name).apply(
                lambda bucket: json.dumps(_read_prefix_policy(bucket, prefixes))
            ),
            opts=pulumi.ResourceOptions(parent=role),
        )
        return role

    def _create_scrape_config(self, metadata: dict[str, Any]) -> None:
        args = self._args
        endpoint = {"port": "metrics", "path": "/metrics", "interval": "15s"}
        # Without our Service, the rollout's stable and canary Services select the same pods
        # between rollouts: scraping them would count every series twice, so scrape the pods.
        kind, role, endpoints = (
            ("ServiceMonitor", "service-monitor", "endpoints")
            if args.rollout is None
            else ("PodMonitor", "pod-monitor", "podMetricsEndpoints")
        )
        k8s.apiextensions.CustomResource(
            f"{self._name}-{role}",
            api_version="monitoring.coreos.com/v1",
            kind=kind,
            metadata=metadata,
            spec={
                "selector": {"matchLabels": pod_selector(args)},
                "namespaceSelector": {"matchNames": [args.namespace]},
                endpoints: [endpoint],
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on)),
        )

    def _create_scaler(
        self, metadata: dict[str, Any], workload: k8s.apps.v1.Deployment | None
    ) -> None:
        args = self._args
        # A rollout component's workload (named args.name) is declared after this component.
        rollout = args.rollout
        api_version, kind = (
            ("apps/v1", "Deployment") if rollout is None else (rollout.api_version, rollout.kind)
        )
        # A Rollout's replicas serve both colours, and so both versions, during a rollout.
        labels = f'model_id="{args.model_id}"'
        if workload is not None:
            labels += f',model_version="{args.version}"'
        k8s.apiextensions.CustomResource(
            f"{self._name}-scaler",
            api_version="keda.sh/v1alpha1",
            kind="ScaledObject",
            metadata=metadata,
            spec={
                "scaleTargetRef": {"apiVersion": api_version, "kind": kind, "name": args.name},
                "minReplicaCount": args.replicas,
                "maxReplicaCount": args.max_replicas,
                # GPU pods take minutes to start: scale down slowly. KEDA's cooldownPeriod only
                # times the last step to zero replicas; every other step down is the HPA's, whose
                # own window (300 s unless set) would drop a pod after five quiet minutes.
                "cooldownPeriod": SCALE_DOWN_WINDOW_S,
                "advanced": {
                    "horizontalPodAutoscalerConfig": {
                        "behavior": {
                            "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S}
                        }
                    }
                },
                "triggers": [prometheus_trigger(args.scaling, labels, args.prometheus_url)],
            },
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[workload] if workload else list(args.depends_on)
            ),
        )


def _service_ports(mode: str) -> list[dict[str, Any]]:
    ports = [
        {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "appProtocol": "grpc"},
        {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
    ]
    if mode == "embedded":
        ports.insert(1, {"name": "openai", "port": OPENAI_PORT, "targetPort": "openai"})
    return ports


def _read_prefix_policy(bucket: str, prefixes: list[str]) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadModelVersion",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"arn:aws:s3:::{bucket}/{prefix}*" for prefix in prefixes],
            },
            {
                "Sid": "ListModelVersion",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*" for prefix in prefixes]}},
            },
        ],
    }
