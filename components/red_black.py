"""Red-Black rollout of one model: an Argo Rollouts canary that shifts Gateway API traffic in
weighted steps, each gated by an analysis of the new colour, compared with the old one while the
old one still takes traffic.

The colour of a pod is its ReplicaSet's ``rollouts-pod-template-hash``: the component injects it
as ``LLM_SERVING_COLOUR`` (downward API) so the metrics proxy labels every series with it, and
the analysis reads the stable and canary hashes from Argo (``podTemplateHashValue``). The stable
side is found by its colour alone: which version it serves depends on how the last rollout
ended, which the stack configuration cannot know.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version as dist_version
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.naming import kubernetes_name

__all__ = [
    "GATEWAY_PLUGIN",
    "STATUS_IMAGE",
    "GatewayRef",
    "RedBlackArgs",
    "RedBlackConfigError",
    "RedBlackRollout",
    "analysis_metrics",
    "copy_tree",
    "with_colour_env",
]

GATEWAY_PLUGIN = "argoproj-labs/gatewayAPI"
ROLLOUTS_API = "argoproj.io/v1alpha1"
GATEWAY_API = "gateway.networking.k8s.io/v1"
COLOUR_ENV = "LLM_SERVING_COLOUR"
POD_HASH_LABEL = "rollouts-pod-template-hash"
COLOUR_LABEL = "llm-serving/colour"
# Argo's own status command waits for the controller to observe the new spec (its
# observedGeneration is a string, which no pulumi.com/waitFor expression can compare with
# metadata.generation), then exits 0 when Healthy and non-zero when the rollout aborts.
STATUS_IMAGE = "quay.io/argoproj/kubectl-argo-rollouts:v1.7.2"
QUERY_NAMES = ("success_ratio", "ttft_p95")
# A label matcher on the version placeholder; the stable side matches any version instead.
VERSION_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"\{\{args\.model_version\}\}"')


class RedBlackConfigError(ValueError):
    """The rollout's arguments are inconsistent; the message names the field."""


@dataclass(frozen=True)
class GatewayRef:
    """The Gateway whose listeners the model's routes attach to."""

    name: str
    """Gateway name."""
    namespace: str | None = None
    """Gateway namespace (the routes' namespace when ``None``)."""
    grpc_section: str | None = None
    """Listener for gRPC (KServe v2), ``None`` for any listener."""
    http_section: str | None = None
    """Listener for the OpenAI HTTP API, ``None`` for any listener."""
    port: int = 443
    """Port clients reach the listeners on."""
    tls: bool = True
    """Whether the listeners terminate TLS (``https``) or serve plain HTTP and h2c."""

    def grpc_address(self, host: str) -> str:
        """Where gRPC clients connect for ``host``."""
        return f"{host}:{self.port}"

    def http_url(self, host: str, path: str = "") -> str:
        """The URL of ``path`` on ``host`` through this Gateway."""
        scheme, default = ("https", 443) if self.tls else ("http", 80)
        netloc = host if self.port == default else f"{host}:{self.port}"
        return f"{scheme}://{netloc}{path}"


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
    """Analysis PromQL by name (``success_ratio``, ``ttft_p95``), with Argo placeholders
    ``{{args.model_id}}``, ``{{args.colour}}`` and ``{{args.model_version}}``, the last only as
    a label matcher's value (``model_version="{{args.model_version}}"``)."""
    success_conditions: Mapping[str, str]
    """Absolute successCondition for the canary side of each query (``result[0] >= 0.99``)."""
    prometheus_address: str
    """Prometheus URL the AnalysisRuns query."""
    replicas: int = 1
    """Pods at 100 %; with dynamicStableScale the two colours share this budget."""
    steps: tuple[int, ...] = (10, 25, 50, 100)
    """Canary weights in percent, strictly increasing and ending at 100."""
    hostnames: tuple[str, ...] = ()
    """Hostnames for both routes (any host when empty)."""
    grpc_port: int = 8001
    """Public KServe gRPC port of the serving container."""
    http_port: int = 8080
    """OpenAI-compatible HTTP port."""
    metrics_port: int = 9400
    """Metrics proxy port."""
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
    missing = [name for name in QUERY_NAMES if name not in args.queries]
    if missing:
        raise RedBlackConfigError(f"queries lacks {', '.join(missing)}")
    for name, query in args.queries.items():
        if name not in args.success_conditions:
            raise RedBlackConfigError(f"success_conditions lacks {name!r}")
        if "{{args.model_version}}" in VERSION_MATCHER.sub("", query):
            raise RedBlackConfigError(
                f"queries[{name!r}] uses {{{{args.model_version}}}} outside a label matcher; "
                'write it as model_version="{{args.model_version}}"'
            )
    if args.replicas < 1:
        raise RedBlackConfigError(f"replicas is {args.replicas}; a Rollout needs at least 1")


def copy_tree(value: Any) -> Any:
    """Copy nested dicts and lists, sharing every other value (Pulumi Outputs cannot be
    deep-copied)."""
    if isinstance(value, Mapping):
        return {key: copy_tree(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [copy_tree(item) for item in value]
    return value


def with_colour_env(pod_template: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the pod template whose containers read their colour from the pod-template hash."""
    template = copy_tree(pod_template)
    colour = {
        "name": COLOUR_ENV,
        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{POD_HASH_LABEL}']"}},
    }
    for container in (template.get("spec") or {}).get("containers") or []:
        env = [e for e in container.get("env") or [] if e.get("name") != COLOUR_ENV]
        container["env"] = [*env, colour]
    return template


def _canary(query: str) -> str:
    return query.replace("{{args.colour}}", "{{args.canary-colour}}").replace(
        "{{args.model_version}}", "{{args.canary-version}}"
    )


def _stable(query: str) -> str:
    # The colour (pod-template hash) alone names the stable ReplicaSet: after a finished
    # rollout it serves the newest version, after an aborted one the version before.
    query = VERSION_MATCHER.sub(lambda match: f'{match.group(1)}!=""', query)
    return query.replace("{{args.colour}}", "{{args.stable-colour}}")


def analysis_metrics(args: RedBlackArgs, name: str) -> list[dict[str, Any]]:
    """The AnalysisTemplate metrics for one query: the canary alone, then canary vs stable."""
    canary, stable = _canary(args.queries[name]), _stable(args.queries[name])
    if name == "ttft_p95":
        compare = f"vector(scalar({canary}) / scalar({stable}))"
        condition = f"result[0] <= {args.ttft_ratio_limit}"
    else:
        compare = f"vector(scalar({canary}) - scalar({stable}))"
        condition = f"result[0] >= {-args.success_ratio_tolerance}"
    common = {
        "interval": args.analysis_interval,
        "count": args.analysis_count,
        "failureLimit": args.failure_limit,
        "initialDelay": args.initial_delay,
    }
    slug = name.replace("_", "-")
    return [
        {
            "name": slug,
            "successCondition": args.success_conditions[name],
            **common,
            "provider": {"prometheus": {"address": args.prometheus_address, "query": canary}},
        },
        {
            "name": f"{slug}-vs-stable",
            "successCondition": condition,
            **common,
            "provider": {"prometheus": {"address": args.prometheus_address, "query": compare}},
        },
    ]


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
            "llm-serving/model-id": args.model_id,
            "llm-serving/strategy": "red-black",
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
        templates = self._create_analysis_templates(child)
        self.rollout = self._create_rollout(
            template, stable, canary, grpc_route, http_route, templates, child
        )

        self.status_job = self._create_status_wait(template, child)
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

        def render(values: list[str]) -> dict[str, str]:
            # Without a hostname the routes answer on the Gateway's address for any host.
            service = f"{values[0]}.{values[1]}.svc"
            gateway = args.gateway
            return {
                "grpc": gateway.grpc_address(host) if host else f"{service}:{args.grpc_port}",
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

        def parent(section: str | None) -> dict[str, Any]:
            ref: dict[str, Any] = {"name": gateway.name}
            if gateway.namespace is not None:
                ref["namespace"] = gateway.namespace
            if section is not None:
                ref["sectionName"] = section
            return ref

        def backends(port: int) -> list[dict[str, Any]]:
            return [
                {"name": stable.metadata.name, "port": port, "weight": 100},
                {"name": canary.metadata.name, "port": port, "weight": 0},
            ]

        routes = []
        for kind, section, port in (
            ("GRPCRoute", gateway.grpc_section, args.grpc_port),
            ("HTTPRoute", gateway.http_section, args.http_port),
        ):
            spec: dict[str, Any] = {
                "parentRefs": [parent(section)],
                "rules": [{"backendRefs": backends(port)}],
            }
            if args.hostnames:
                spec["hostnames"] = list(args.hostnames)
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
        return routes[0], routes[1]

    def _create_analysis_templates(
        self, opts: pulumi.ResourceOptions
    ) -> tuple[k8s.apiextensions.CustomResource, k8s.apiextensions.CustomResource]:
        """The canary's absolute bounds, and its comparison with the stable colour."""
        per_query = [analysis_metrics(self._args, name) for name in QUERY_NAMES]
        canary_args = ["model_id", "canary-colour", "canary-version"]

        def template(
            role: str, arg_names: list[str], metrics: list[dict[str, Any]]
        ) -> k8s.apiextensions.CustomResource:
            return k8s.apiextensions.CustomResource(
                f"{self._name}-{role}",
                api_version=ROLLOUTS_API,
                kind="AnalysisTemplate",
                metadata=self._meta(),
                spec={"args": [{"name": n} for n in arg_names], "metrics": metrics},
                opts=opts,
            )

        return (
            template("canary", canary_args, [alone for alone, _ in per_query]),
            template(
                "vs-stable",
                [*canary_args, "stable-colour"],
                [compare for _, compare in per_query],
            ),
        )

    def _analysis_step(
        self, templates: Sequence[k8s.apiextensions.CustomResource]
    ) -> dict[str, Any]:
        args = self._args
        return {
            "analysis": {
                "templates": [{"templateName": t.metadata["name"]} for t in templates],
                "args": [
                    {"name": "model_id", "value": args.model_id},
                    {"name": "canary-version", "value": args.version},
                    {"name": "canary-colour", "valueFrom": {"podTemplateHashValue": "Latest"}},
                    {"name": "stable-colour", "valueFrom": {"podTemplateHashValue": "Stable"}},
                ],
            }
        }

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
            steps += [{"setWeight": weight}, self._analysis_step(step_templates)]
        annotations = {
            # Argo's status Job is the wait: a waitFor here could read the previous revision's
            # Healthy before the controller has seen the update.
            "pulumi.com/skipAwait": "true",
            "llm-serving/model-version": args.version,
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

    def _create_status_wait(
        self, template: dict[str, Any], opts: pulumi.ResourceOptions
    ) -> k8s.batch.v1.Job:
        """A Job per revision running ``kubectl argo rollouts status``; Pulumi waits for Jobs to
        complete, so ``pulumi up`` ends when the rollout is Healthy and fails when it aborts."""
        args = self._args
        account = k8s.core.v1.ServiceAccount(
            f"{self._name}-status", metadata=self._meta(), opts=opts
        )
        role = k8s.rbac.v1.Role(
            f"{self._name}-status",
            metadata=self._meta(),
            # `kubectl argo rollouts status` runs Argo's view controller, whose informers must
            # sync before its --timeout starts; without list/watch on each it waits until the
            # Job's deadline. Deployments back workloadRef Rollouts: unread, their informer
            # would still retry and flood the log that becomes the Job's failure message.
            rules=[
                {
                    "apiGroups": ["argoproj.io"],
                    "resources": ["rollouts", "analysisruns", "experiments"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": ["apps"],
                    "resources": ["replicasets", "deployments"],
                    "verbs": ["get", "list", "watch"],
                },
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            ],
            opts=opts,
        )
        binding = k8s.rbac.v1.RoleBinding(
            f"{self._name}-status",
            metadata=self._meta(),
            role_ref={
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": role.metadata.name,
            },
            subjects=[
                {
                    "kind": "ServiceAccount",
                    "name": account.metadata.name,
                    "namespace": args.namespace,
                }
            ],
            opts=opts,
        )
        # One Job per revision: the name carries a digest of the version and the pod template,
        # so an unchanged stack keeps its finished Job and any change starts a new wait.
        revision = pulumi.Output.json_dumps({"version": args.version, "template": template})
        digest = revision.apply(lambda text: hashlib.sha256(text.encode()).hexdigest()[:10])
        rollout_name = self.rollout.metadata.apply(lambda metadata: metadata["name"])
        timeout = args.await_timeout_seconds
        container = {
            "name": "rollout-status",
            "image": args.status_image,
            # The command's last lines (Argo's abort reason) become the pod's termination
            # message, which Pulumi reports with the failed Job.
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "args": rollout_name.apply(
                lambda name: [
                    "status",
                    name,
                    "--namespace",
                    args.namespace,
                    "--timeout",
                    f"{timeout}s",
                ]
            ),
            "resources": {
                "requests": {"cpu": "10m", "memory": "32Mi"},
                "limits": {"cpu": "100m", "memory": "64Mi"},
            },
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
        }
        annotations = {"pulumi.com/timeoutSeconds": str(timeout + 300)}
        return k8s.batch.v1.Job(
            f"{self._name}-status",
            metadata=self._meta(
                name=pulumi.Output.all(rollout_name, digest).apply(
                    lambda parts: f"{parts[0][:40].rstrip('-')}-status-{parts[1]}"
                ),
                annotations=annotations,
            ),
            spec={
                "backoffLimit": 0,
                "activeDeadlineSeconds": timeout + 120,
                "template": {
                    # Not the serving labels: no selector of the model's pods may match it.
                    "metadata": {"labels": {"llm-serving/rollout-status": args.model_id}},
                    "spec": {
                        "serviceAccountName": account.metadata.name,
                        "restartPolicy": "Never",
                        "containers": [container],
                    },
                },
            },
            opts=pulumi.ResourceOptions.merge(
                opts, pulumi.ResourceOptions(depends_on=[self.rollout, binding])
            ),
        )
