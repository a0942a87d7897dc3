"""Red-Black rollout of one model: an Argo Rollouts canary that shifts Gateway API traffic in
weighted steps, each gated by an analysis of the new colour (:mod:`components.rollout_analysis`),
and waited for by Argo's status command (:mod:`components.rollout_status`).

The colour of a pod is its ReplicaSet's ``rollouts-pod-template-hash``: the component injects it
as ``LLM_SERVING_COLOUR`` (downward API) so the metrics proxy labels every series with it, and
the analysis reads the stable and canary hashes from Argo (``podTemplateHashValue``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version as dist_version
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.gateway import (
    GATEWAY_API,
    GATEWAY_PLUGIN,
    GatewayRef,
    RouteTimeouts,
    create_grpc_route_timeout,
)
from components.pod_templates import with_colour_env
from components.rollout_analysis import (
    ROLLOUTS_API,
    analysis_step,
    create_analysis_templates,
)
from components.rollout_status import STATUS_IMAGE, StatusWait, create_status_wait
from contracts.labels import (
    COLOUR_LABEL,
    MODEL_ID_LABEL,
    MODEL_VERSION_ANNOTATION,
    STRATEGY_LABEL,
)
from contracts.naming import kubernetes_name
from contracts.promql import ROLLOUT_PLACEHOLDERS, ROLLOUT_QUERY_NAMES, AssetError, placeholders_of

__all__ = ["RedBlackArgs", "RedBlackConfigError", "RedBlackRollout"]


class RedBlackConfigError(ValueError):
    """The rollout's arguments are inconsistent; the message names the field."""


# What Go's time.ParseDuration reads (Argo parses interval and initialDelay with it), less signs.
_DURATION = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?(?:ns|us|ms|s|m|h))+")


@dataclass(frozen=True)
class RedBlackArgs:
    """One model served by one Rollout; a change of ``version`` or of the pod is a rollout."""

    model_id: str
    """Model id (``llm-serving:models[].id``)."""
    version: str
    """The version to serve: the last one listed for the model."""
    pod_template: Mapping[str, Any]
    """Pod template (metadata + spec) from ``components.model_service.build_pod_template``."""
    namespace: pulumi.Input[str]
    """Namespace of the Rollout, its Services, routes and analysis templates."""
    gateway: GatewayRef
    """The Gateway the GRPCRoute and HTTPRoute attach to."""
    queries: Mapping[str, str]
    """Analysis PromQL templates by name (``success_ratio``, ``ttft_p95``), with the
    placeholders of ``contracts.promql.ROLLOUT_PLACEHOLDERS`` (``${model_id}``, ``${colour}``,
    ``${version_matcher}``)."""
    success_conditions: Mapping[str, str]
    """Absolute successCondition for the canary side of each query (``result[0] >= 0.99``)."""
    prometheus_address: str
    """Prometheus URL the AnalysisRuns query."""
    replicas: int = 1
    """Pods at 100 %; with dynamicStableScale the two colours share this budget."""
    steps: tuple[int, ...] = (10, 25, 50, 100)
    """Canary weights in percent, strictly increasing and ending at 100."""
    hostnames: tuple[str, ...] = ()
    """Hostnames of the HTTPRoute, the OpenAI API (any host when empty)."""
    grpc_hostnames: tuple[str, ...] = ()
    """Hostnames of the GRPCRoute, KServe v2 gRPC (any host when empty); never one of
    ``hostnames`` on a shared listener (see :func:`components.gateway.route_hosts`)."""
    grpc_port: int = 8001
    """Public KServe gRPC port of the serving container."""
    http_port: int = 8080
    """OpenAI-compatible HTTP port."""
    metrics_port: int = 9400
    """Metrics proxy port."""
    timeouts: RouteTimeouts = field(default_factory=RouteTimeouts)
    """How long the Gateway lets one request through either route run (the HTTPRoute's
    ``timeouts``, a BackendTrafficPolicy on the GRPCRoute): just above the pods' deadline."""
    analysis_interval: str = "1m"
    """Time between measurements of one analysis."""
    analysis_count: int = 5
    """Measurements per analysis step."""
    failure_limit: int = 1
    """Failed measurements tolerated before the step fails and the rollout aborts."""
    initial_delay: str = "2m"
    """Wait after a weight change before measuring (the queries use 2 m rate windows)."""
    success_ratio_tolerance: float = 0.005
    """How far the new colour's success ratio may fall below the old colour's."""
    ttft_ratio_limit: float = 1.25
    """Largest allowed ratio of the new colour's TTFT p95 to the old colour's."""
    progress_deadline_seconds: int = 3600
    """A step (GPU pods starting included) that makes no progress this long aborts."""
    await_timeout_seconds: int = 7200
    """How long ``pulumi up`` waits for the rollout to settle."""
    status_image: str = STATUS_IMAGE
    """Image of ``kubectl argo rollouts`` that waits for each revision; keep it in step with
    the Argo Rollouts controller that ``ClusterAddons`` installs."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra labels for every object."""
    name: str | None = None
    """``metadata.name`` of the Rollout (auto-named when ``None``); name it when something
    else refers to it, such as a KEDA ScaledObject."""
    scaled_externally: bool = False
    """An autoscaler owns ``spec.replicas`` after creation; Pulumi then leaves it alone."""
    depends_on: Sequence[pulumi.Resource] = ()
    """What every object waits for: the namespace, the Gateway API and Argo CRDs, and for the
    Rollout the version's materialize Job and its service account."""


def _validate(args: RedBlackArgs) -> None:
    steps = list(args.steps)
    if not steps or steps[-1] != 100:
        raise RedBlackConfigError(f"steps {steps} must end at 100 (e.g. 10, 25, 50, 100)")
    if any(not 0 < w <= 100 for w in steps) or steps != sorted(set(steps)):
        raise RedBlackConfigError(f"steps {steps} must be strictly increasing within 1..100")
    missing = [name for name in ROLLOUT_QUERY_NAMES if name not in args.queries]
    if missing:
        raise RedBlackConfigError(f"queries lacks {', '.join(missing)}")
    # The analysis knows how to compare only these; another query would be dropped unseen.
    extra = sorted(set(args.queries) - set(ROLLOUT_QUERY_NAMES))
    if extra:
        raise RedBlackConfigError(
            f"queries names {', '.join(extra)}; the analysis measures only: "
            f"{', '.join(ROLLOUT_QUERY_NAMES)}"
        )
    for name, query in args.queries.items():
        if name not in args.success_conditions:
            raise RedBlackConfigError(f"success_conditions lacks {name!r}")
        try:
            unknown = placeholders_of(query) - ROLLOUT_PLACEHOLDERS
        except AssetError as exc:
            raise RedBlackConfigError(f"queries[{name!r}]: {exc}") from exc
        if unknown:
            raise RedBlackConfigError(
                f"queries[{name!r}] names the placeholder {', '.join(sorted(unknown))}; "
                f"expected only: {', '.join(sorted(ROLLOUT_PLACEHOLDERS))}"
            )
    if args.replicas < 1:
        raise RedBlackConfigError(f"replicas is {args.replicas}; a Rollout needs at least 1")
    _check_analysis(args)
    _check_hostnames(args)


def _check_analysis(args: RedBlackArgs) -> None:
    """Argo refuses a step analysis without a positive count or with an unparsable duration, and
    one whose failureLimit reaches its count can never fail (every canary is promoted)."""
    if args.analysis_count < 1:
        raise RedBlackConfigError(
            f"analysis_count is {args.analysis_count}; an analysis step needs at least 1 "
            "measurement (Argo refuses a metric that runs indefinitely)"
        )
    if not 0 <= args.failure_limit < args.analysis_count:
        raise RedBlackConfigError(
            f"failure_limit is {args.failure_limit}; expected 0..{args.analysis_count - 1} "
            f"(below analysis_count {args.analysis_count}, or no failure could fail the step)"
        )
    for name in ("analysis_interval", "initial_delay"):
        value = getattr(args, name)
        if not _DURATION.fullmatch(value):
            raise RedBlackConfigError(
                f"{name} is {value!r}; expected a Go duration such as 90s, 2m or 1m30s"
            )


def _check_hostnames(args: RedBlackArgs) -> None:
    """A listener accepts only one of a GRPCRoute and an HTTPRoute claiming one hostname."""
    gateway = args.gateway
    sections = {gateway.grpc_section, gateway.http_section}
    if None not in sections and len(sections) == 2:
        return  # distinct listeners
    shared = set(args.hostnames or ("*",)) & set(args.grpc_hostnames or ("*",))
    if shared:
        raise RedBlackConfigError(
            f"hostnames and grpc_hostnames both claim {', '.join(sorted(shared))} on one "
            "Gateway listener ('*' is no hostname); give the GRPCRoute its own hostname "
            "(components.gateway.route_hosts) or its own listener (GatewayRef.grpc_section)"
        )


class _Rollout(pulumi.CustomResource):
    """An Argo ``Rollout``; its resolved ``metadata`` names it for the status Job."""

    metadata: pulumi.Output[Any]

    def __init__(self, name: str, metadata: Any, spec: Any, opts: pulumi.ResourceOptions) -> None:
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(version=dist_version("pulumi_kubernetes"))
        )
        props = {"apiVersion": ROLLOUTS_API, "kind": "Rollout", "metadata": metadata}
        props |= {"spec": spec, "status": None}
        super().__init__(f"kubernetes:{ROLLOUTS_API}:Rollout", name, props, opts)


class RedBlackRollout(pulumi.ComponentResource):
    """Rollout, stable and canary Services, GRPCRoute, HTTPRoute and AnalysisTemplates."""

    status_job_name: pulumi.Output[str]
    endpoints: pulumi.Output[dict[str, str]]
    grpc_route_name: pulumi.Output[str]
    http_route_name: pulumi.Output[str]
    stable_service_name: pulumi.Output[str]

    def __init__(
        self, name: str, args: RedBlackArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        _validate(args)
        super().__init__("llm-serving:red_black:RedBlackRollout", name, None, opts)
        self._name, self._args = name, args
        # Children do not inherit a component's dependencies: each names them itself.
        child = pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on))
        self._labels = {
            **args.labels,
            MODEL_ID_LABEL: args.model_id,
            STRATEGY_LABEL: "red-black",
        }
        template = with_colour_env(args.pod_template)
        metadata = template.setdefault("metadata", {})
        # The colour is the pod-template hash; a fixed colour label would mislabel one side.
        labels = {k: v for k, v in (metadata.get("labels") or {}).items() if k != COLOUR_LABEL}
        metadata["labels"] = {**labels, **self._labels}
        # Only labels that never change between versions: a Rollout's selector must not move.
        self._selector = dict(self._labels)

        stable, canary = self._create_services(child)
        grpc_route, http_route = self._create_routes(stable, canary, child)
        templates = create_analysis_templates(self._name, args, self._meta, child)
        self.rollout = self._create_rollout(
            template, stable, canary, grpc_route, http_route, templates, child
        )

        wait = StatusWait(
            model_id=args.model_id,
            version=args.version,
            namespace=args.namespace,
            template=template,
            rollout=self.rollout,
            rollout_name=self.rollout.metadata.apply(lambda metadata: metadata["name"]),
            image=args.status_image,
            timeout_seconds=args.await_timeout_seconds,
        )
        self.status_job = create_status_wait(self._name, wait, self._meta, child)
        self.status_job_name = self.status_job.metadata.name
        self.grpc_route_name = grpc_route.metadata["name"]
        self.http_route_name = http_route.metadata["name"]
        self.stable_service_name = stable.metadata.name
        self.endpoints = self._endpoints(stable)
        self.register_outputs(
            {
                "status_job_name": self.status_job_name,
                "endpoints": self.endpoints,
                "grpc_route_name": self.grpc_route_name,
                "http_route_name": self.http_route_name,
                "stable_service_name": self.stable_service_name,
            }
        )

    def _endpoints(self, stable: k8s.core.v1.Service) -> pulumi.Output[dict[str, str]]:
        args = self._args
        host = args.hostnames[0] if args.hostnames else None
        grpc_host = args.grpc_hostnames[0] if args.grpc_hostnames else None

        def render(values: list[str]) -> dict[str, str]:
            # Without a hostname the routes answer on the Gateway's address for any host.
            service = f"{values[0]}.{values[1]}.svc"
            gateway = args.gateway
            return {
                "grpc": gateway.grpc_address(grpc_host)
                if grpc_host
                else f"{service}:{args.grpc_port}",
                "openai": gateway.http_url(host, "/v1")
                if host
                else f"http://{service}:{args.http_port}/v1",
                "metrics": f"http://{service}:{args.metrics_port}/metrics",
            }

        return pulumi.Output.all(stable.metadata.name, args.namespace).apply(render)

    def _meta(self, **extra: Any) -> dict[str, Any]:
        return {"namespace": self._args.namespace, "labels": dict(self._labels), **extra}

    def _create_services(
        self, opts: pulumi.ResourceOptions
    ) -> tuple[k8s.core.v1.Service, k8s.core.v1.Service]:
        args = self._args
        ports = [
            {
                "name": "grpc",
                "port": args.grpc_port,
                "targetPort": args.grpc_port,
                "appProtocol": "kubernetes.io/h2c",
            },
            {"name": "http", "port": args.http_port, "targetPort": args.http_port},
            {"name": "metrics", "port": args.metrics_port, "targetPort": args.metrics_port},
        ]
        # Argo adds the rollouts-pod-template-hash to each selector to split the colours; the
        # selector map is atomic, so Pulumi must not re-apply its own copy over Argo's.
        service_opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(ignore_changes=["spec.selector"])
        )
        return tuple(
            k8s.core.v1.Service(
                f"{self._name}-{side}",
                # A Service name is a DNS-1035 label: at most 63 characters.
                metadata=self._meta(**kubernetes_name(f"{self._name}-{side}")),
                spec={"selector": dict(self._selector), "ports": ports},
                opts=service_opts,
            )
            for side in ("stable", "canary")
        )

    def _create_routes(
        self,
        stable: k8s.core.v1.Service,
        canary: k8s.core.v1.Service,
        opts: pulumi.ResourceOptions,
    ) -> tuple[k8s.apiextensions.CustomResource, k8s.apiextensions.CustomResource]:
        args, gateway = self._args, self._args.gateway
        # The plugin owns the weights during a rollout; Pulumi must not reset them mid-way.
        route_opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(ignore_changes=["spec.rules[*].backendRefs[*].weight"])
        )

        def backends(port: int) -> list[dict[str, Any]]:
            return [
                {"name": stable.metadata.name, "port": port, "weight": 100},
                {"name": canary.metadata.name, "port": port, "weight": 0},
            ]

        routes = []
        for kind, section, port, hostnames in (
            ("GRPCRoute", gateway.grpc_section, args.grpc_port, args.grpc_hostnames),
            ("HTTPRoute", gateway.http_section, args.http_port, args.hostnames),
        ):
            rule: dict[str, Any] = {"backendRefs": backends(port)}
            if kind == "HTTPRoute":
                rule["timeouts"] = args.timeouts.http_rule()
            spec: dict[str, Any] = {"parentRefs": [gateway.parent_ref(section)], "rules": [rule]}
            if hostnames:
                spec["hostnames"] = list(hostnames)
            routes.append(
                k8s.apiextensions.CustomResource(
                    f"{self._name}-{kind.lower()}",
                    api_version=GATEWAY_API,
                    kind=kind,
                    metadata=self._meta(),
                    spec=spec,
                    opts=route_opts,
                )
            )
        # The GRPCRoute type has no timeouts: Envoy Gateway's policy bounds it. The plugin sets
        # only weights (its Gateway API types keep the HTTPRoute's timeouts on update).
        create_grpc_route_timeout(
            f"{self._name}-grpcroute-timeout", routes[0], args.timeouts, self._meta(), opts
        )
        return routes[0], routes[1]

    def _create_rollout(
        self,
        template: dict[str, Any],
        stable: k8s.core.v1.Service,
        canary: k8s.core.v1.Service,
        grpc_route: k8s.apiextensions.CustomResource,
        http_route: k8s.apiextensions.CustomResource,
        templates: tuple[k8s.apiextensions.CustomResource, k8s.apiextensions.CustomResource],
        opts: pulumi.ResourceOptions,
    ) -> _Rollout:
        args = self._args
        alone, versus = templates
        steps: list[dict[str, Any]] = []
        for weight in args.steps:
            # At 100 the stable colour takes no traffic (and dynamicStableScale scales it to 0):
            # a comparison would read NaN and abort every healthy rollout.
            step_templates = [alone, versus] if weight < 100 else [alone]
            steps += [{"setWeight": weight}, analysis_step(args, step_templates)]
        annotations = {
            # Argo's status Job is the wait: a waitFor here could read the previous revision's
            # Healthy before the controller has seen the update.
            "pulumi.com/skipAwait": "true",
            MODEL_VERSION_ANNOTATION: args.version,
        }
        spec = {
            "replicas": args.replicas,
            "selector": {"matchLabels": dict(self._selector)},
            "template": template,
            "revisionHistoryLimit": 2,
            "progressDeadlineSeconds": args.progress_deadline_seconds,
            "progressDeadlineAbort": True,
            "strategy": {
                "canary": {
                    "stableService": stable.metadata.name,
                    "canaryService": canary.metadata.name,
                    "dynamicStableScale": True,
                    "trafficRouting": {
                        "plugins": {
                            GATEWAY_PLUGIN: {
                                "grpcRoute": grpc_route.metadata["name"],
                                "httpRoute": http_route.metadata["name"],
                                "namespace": args.namespace,
                            }
                        }
                    },
                    "steps": steps,
                }
            },
        }
        metadata = self._meta(annotations=annotations)
        if args.name is not None:
            metadata["name"] = args.name
        return _Rollout(
            self._name,
            metadata=metadata,
            spec=spec,
            opts=pulumi.ResourceOptions.merge(
                opts,
                pulumi.ResourceOptions(
                    depends_on=[*args.depends_on, *templates, grpc_route, http_route],
                    ignore_changes=["spec.replicas"] if args.scaled_externally else None,
                ),
            ),
        )
