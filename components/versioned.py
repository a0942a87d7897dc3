"""Versioned serving of one model: an independent Deployment, Service, GRPCRoute and HTTPRoute
per ``(model_id, model_version)``, each version on its own hostname, plus a shared weighted
route over the versions that carry a ``route_weight``.

Consumers pin a version by hostname and switch on their own schedule; removing a version from
the stack configuration removes exactly its resources (their names embed the version).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.gateway import (
    GATEWAY_API,
    GatewayRef,
    RouteHosts,
    RouteTimeouts,
    create_grpc_route_timeout,
    route_hosts,
)
from components.pod_templates import copy_tree
from contracts.labels import (
    CREATED_AT_ANNOTATION,
    MODEL_ID_LABEL,
    MODEL_VERSION_LABEL,
    NEWEST_ANNOTATION,
    ROUTE_WEIGHT_ANNOTATION,
    STRATEGY_LABEL,
)
from contracts.naming import dns_label, kubernetes_name, route_label

__all__ = [
    "VersionSpec",
    "VersionedArgs",
    "VersionedConfigError",
    "VersionedModel",
    "age_annotations",
]


class VersionedConfigError(ValueError):
    """The Versioned model's arguments are inconsistent; the message names the field."""


@dataclass(frozen=True)
class VersionSpec:
    """One listed version."""

    version: str
    """Version (``models/<id>/<version>/`` in the model bucket)."""
    pod_template: Mapping[str, Any] | None = None
    """Its pod template, from ``components.model_service.build_pod_template``: the component
    then creates the version's Deployment and Service."""
    service_name: pulumi.Input[str] | None = None
    """Instead of ``pod_template``: the Service of a workload created elsewhere (a
    ``ModelService``); the component then adds only the routes and outputs."""
    replicas: int = 1
    """Pods serving this version."""
    route_weight: int | None = None
    """Share of the model's shared hostname, or ``None`` to serve only on its own hostname."""
    created_at: str | None = None
    """ISO 8601 date or time the version was first deployed (read by the advisory age
    policy)."""


@dataclass(frozen=True)
class VersionedArgs:
    """A model whose every listed version is deployed independently."""

    model_id: str
    """Model id."""
    versions: tuple[VersionSpec, ...]
    """Listed versions, oldest first (the last is the newest)."""
    namespace: pulumi.Input[str]
    """Namespace of every object."""
    gateway: GatewayRef
    """Gateway the routes attach to."""
    domain: str
    """Base domain: versions answer on ``<version>.<model_id>.<domain>`` (OpenAI HTTP) and
    ``<version>.<model_id>.grpc.<domain>`` (gRPC), the shared routes on ``<model_id>.<domain>``
    and ``<model_id>.grpc.<domain>`` (:func:`components.gateway.route_hosts`)."""
    grpc_port: int = 8001
    """Public KServe gRPC port."""
    http_port: int = 8080
    """OpenAI-compatible HTTP port."""
    metrics_port: int = 9400
    """Metrics proxy port."""
    timeouts: RouteTimeouts = field(default_factory=RouteTimeouts)
    """How long the Gateway lets one request through any of the routes run (HTTPRoutes'
    ``timeouts``, a BackendTrafficPolicy on each GRPCRoute): just above the pods' deadline."""
    startup_timeout_seconds: int = 1800
    """How long a version's pods may take to become ready (weights loaded); the Deployments of
    versions given by ``pod_template`` are awaited, and may progress, 600 s longer."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra labels for every object."""
    depends_on: Sequence[pulumi.Resource] = ()
    """What every object waits for: the namespace, the Gateway API CRDs, the workloads of
    versions given by ``service_name``."""


def _route_label(value: str) -> str:
    """:func:`contracts.naming.route_label` of ``value``; raises `VersionedConfigError` where
    that is no DNS label."""
    label = route_label(value)
    if not label or len(label) > 63:
        raise VersionedConfigError(f"{value!r} cannot be a DNS label (1-63 of a-z, 0-9, -)")
    return label


def age_annotations(spec: VersionSpec, newest: bool) -> dict[str, str]:
    """Annotations of a version's Service that the advisory age policy reads."""
    annotations = {NEWEST_ANNOTATION: "true" if newest else "false"}
    if spec.created_at is not None:
        annotations[CREATED_AT_ANNOTATION] = spec.created_at
    # versions gc keeps a version with a route weight whatever its age; so does the policy.
    if spec.route_weight is not None:
        annotations[ROUTE_WEIGHT_ANNOTATION] = str(spec.route_weight)
    return annotations


def _validate(args: VersionedArgs) -> None:
    if not args.versions:
        raise VersionedConfigError(f"model {args.model_id}: versions is empty; list at least one")
    hosts: set[str] = set()
    labels: set[str] = set()
    for index, spec in enumerate(args.versions):
        # Versions need distinct hostnames and distinct label values (their pods' selector);
        # the label collapses runs of other characters that the hostname keeps.
        host, label = _route_label(spec.version), dns_label(spec.version)
        if host in hosts or label in labels:
            raise VersionedConfigError(
                f"model {args.model_id}: versions[{index}] {spec.version!r} repeats a version"
            )
        hosts.add(host)
        labels.add(label)
        if (spec.pod_template is None) == (spec.service_name is None):
            raise VersionedConfigError(
                f"model {args.model_id}: versions[{index}] needs exactly one of pod_template "
                "and service_name"
            )
        if spec.route_weight is not None and not 0 <= spec.route_weight <= 100:
            raise VersionedConfigError(
                f"model {args.model_id}: versions[{index}].route_weight is {spec.route_weight}; "
                "expected 0..100"
            )
    weights = [s.route_weight for s in args.versions if s.route_weight is not None]
    if weights and sum(weights) != 100:
        raise VersionedConfigError(
            f"model {args.model_id}: route_weight values sum to {sum(weights)}; they must sum "
            "to 100 (or leave route_weight unset everywhere)"
        )


class VersionedModel(pulumi.ComponentResource):
    """Per-version Deployments, Services and routes, and a weighted shared route."""

    endpoints: dict[str, pulumi.Output[dict[str, str]]]

    def __init__(
        self, name: str, args: VersionedArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        _validate(args)
        super().__init__("llm-serving:versioned:VersionedModel", name, None, opts)
        self._name, self._args = name, args
        # Children do not inherit a component's dependencies: each names them itself.
        self._child = pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on))
        newest = args.versions[-1].version
        services: dict[str, pulumi.Input[str]] = {}
        self.endpoints = {}
        for spec in args.versions:
            services[spec.version] = self._create_version(spec, spec.version == newest)
            self.endpoints[spec.version] = self._endpoints(
                services[spec.version], self._hosts(spec.version)
            )
        weighted = [s for s in args.versions if s.route_weight is not None]
        if weighted:
            host = route_hosts((_route_label(args.model_id),), args.domain)
            self._create_routes(
                f"{name}-shared", host, [(services[s.version], s.route_weight) for s in weighted]
            )
        self.register_outputs({"endpoints": self.endpoints})

    def _hosts(self, version: str) -> RouteHosts:
        labels = (_route_label(version), _route_label(self._args.model_id))
        return route_hosts(labels, self._args.domain)

    def _meta(self, version: str, **extra: Any) -> dict[str, Any]:
        # As ModelService labels its objects: a version such as ``v5_`` is no label value.
        labels = {
            **self._args.labels,
            MODEL_ID_LABEL: dns_label(self._args.model_id),
            MODEL_VERSION_LABEL: dns_label(version),
            STRATEGY_LABEL: "versioned",
        }
        return {"namespace": self._args.namespace, "labels": labels, **extra}

    def _create_version(self, spec: VersionSpec, newest: bool) -> pulumi.Input[str]:
        """The version's workload (unless it brings its own Service) and routes; returns the
        name of the Service its routes point at."""
        args, prefix = self._args, f"{self._name}-{_route_label(spec.version)}"
        host = self._hosts(spec.version)
        if spec.service_name is not None:
            self._create_routes(prefix, host, [(spec.service_name, None)], version=spec.version)
            return spec.service_name
        template = copy_tree(spec.pod_template)
        metadata = template.setdefault("metadata", {})
        selector = self._meta(spec.version)["labels"]
        metadata["labels"] = {**(metadata.get("labels") or {}), **selector}
        # Kubernetes' default 600 s progress deadline and pulumi-kubernetes' 10-minute wait are
        # shorter than a GPU pod's start: either would fail `pulumi up` on a healthy version.
        deadline = args.startup_timeout_seconds + 600
        k8s.apps.v1.Deployment(
            f"{prefix}-deployment",
            metadata=self._meta(
                spec.version, annotations={"pulumi.com/timeoutSeconds": str(deadline)}
            ),
            spec={
                "replicas": spec.replicas,
                "selector": {"matchLabels": selector},
                "progressDeadlineSeconds": deadline,
                "template": template,
            },
            opts=self._child,
        )
        service = k8s.core.v1.Service(
            f"{prefix}-service",
            # A Service name is a DNS-1035 label: at most 63 characters.
            metadata=self._meta(
                spec.version,
                annotations=age_annotations(spec, newest),
                **kubernetes_name(f"{prefix}-service"),
            ),
            spec={
                "selector": selector,
                "ports": [
                    {"name": "grpc", "port": args.grpc_port, "appProtocol": "kubernetes.io/h2c"},
                    {"name": "http", "port": args.http_port},
                    {"name": "metrics", "port": args.metrics_port},
                ],
            },
            opts=self._child,
        )
        self._create_routes(prefix, host, [(service.metadata.name, None)], version=spec.version)
        return service.metadata.name

    def _create_routes(
        self,
        prefix: str,
        host: RouteHosts,
        backends: list[tuple[pulumi.Input[str], int | None]],
        version: str = "shared",
    ) -> None:
        gateway = self._args.gateway
        for kind, section, port, hostname in (
            ("GRPCRoute", gateway.grpc_section, self._args.grpc_port, host.grpc),
            ("HTTPRoute", gateway.http_section, self._args.http_port, host.http),
        ):
            refs = []
            for service_name, weight in backends:
                ref: dict[str, Any] = {"name": service_name, "port": port}
                if weight is not None:
                    ref["weight"] = weight
                refs.append(ref)
            rule: dict[str, Any] = {"backendRefs": refs}
            if kind == "HTTPRoute":
                rule["timeouts"] = self._args.timeouts.http_rule()
            route = k8s.apiextensions.CustomResource(
                f"{prefix}-{kind.lower()}",
                api_version=GATEWAY_API,
                kind=kind,
                metadata=self._meta(version),
                spec={
                    "parentRefs": [gateway.parent_ref(section)],
                    "hostnames": [hostname],
                    "rules": [rule],
                },
                opts=self._child,
            )
            if kind == "GRPCRoute":
                # The GRPCRoute type has no timeouts: Envoy Gateway's policy bounds it.
                create_grpc_route_timeout(
                    f"{prefix}-grpcroute-timeout",
                    route,
                    self._args.timeouts,
                    self._meta(version),
                    self._child,
                )

    def _endpoints(
        self, service_name: pulumi.Input[str], host: RouteHosts
    ) -> pulumi.Output[dict[str, str]]:
        args = self._args
        return pulumi.Output.all(service_name, args.namespace).apply(
            lambda values: {
                "grpc": args.gateway.grpc_address(host.grpc),
                "openai": args.gateway.http_url(host.http, "/v1"),
                "metrics": f"http://{values[0]}.{values[1]}.svc:{args.metrics_port}/metrics",
            }
        )
