"""The health analysis of a Red-Black rollout: Argo Rollouts AnalysisTemplates that measure the
new colour alone, then against the old colour while it still takes traffic.

Queries come from ``contracts.promql`` as templates; the canary side is rendered for the new
colour and version, the stable side for its colour and any version (which version the stable
ReplicaSet serves depends on how the last rollout ended, which no configuration can know).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import pulumi
import pulumi_kubernetes as k8s

from contracts.promql import ANY_VERSION, ROLLOUT_QUERY_NAMES, render_rollout_query

__all__ = [
    "ROLLOUTS_API",
    "AnalysisSettings",
    "analysis_metrics",
    "analysis_step",
    "create_analysis_templates",
]

ROLLOUTS_API = "argoproj.io/v1alpha1"
# Argo fills these from the analysis step's args (see analysis_step).
_CANARY = {"model_id": "{{args.model_id}}", "colour": "{{args.canary-colour}}"}
_STABLE = {"model_id": "{{args.model_id}}", "colour": "{{args.stable-colour}}"}
_CANARY_ARGS = ["model_id", "canary-colour", "canary-version"]


class AnalysisSettings(Protocol):
    """What the analysis reads from the rollout's arguments."""

    @property
    def model_id(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def queries(self) -> Mapping[str, str]: ...
    @property
    def success_conditions(self) -> Mapping[str, str]: ...
    @property
    def prometheus_address(self) -> str: ...
    @property
    def analysis_interval(self) -> str: ...
    @property
    def analysis_count(self) -> int: ...
    @property
    def failure_limit(self) -> int: ...
    @property
    def initial_delay(self) -> str: ...
    @property
    def success_ratio_tolerance(self) -> float: ...
    @property
    def ttft_ratio_limit(self) -> float: ...


def analysis_metrics(args: AnalysisSettings, name: str) -> list[dict[str, Any]]:
    """The AnalysisTemplate metrics for one query: the canary alone, then canary vs stable."""
    query = args.queries[name]
    canary = render_rollout_query(query, **_CANARY, model_version="{{args.canary-version}}")
    stable = render_rollout_query(query, **_STABLE, model_version=ANY_VERSION)
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


def create_analysis_templates(
    name: str,
    args: AnalysisSettings,
    metadata: Callable[[], dict[str, Any]],
    opts: pulumi.ResourceOptions,
) -> tuple[k8s.apiextensions.CustomResource, k8s.apiextensions.CustomResource]:
    """The canary's absolute bounds (``<name>-canary``), and its comparison with the stable
    colour (``<name>-vs-stable``)."""
    per_query = [analysis_metrics(args, query) for query in ROLLOUT_QUERY_NAMES]

    def template(
        role: str, arg_names: list[str], metrics: list[dict[str, Any]]
    ) -> k8s.apiextensions.CustomResource:
        return k8s.apiextensions.CustomResource(
            f"{name}-{role}",
            api_version=ROLLOUTS_API,
            kind="AnalysisTemplate",
            metadata=metadata(),
            spec={"args": [{"name": n} for n in arg_names], "metrics": metrics},
            opts=opts,
        )

    return (
        template("canary", _CANARY_ARGS, [alone for alone, _ in per_query]),
        template(
            "vs-stable",
            [*_CANARY_ARGS, "stable-colour"],
            [compare for _, compare in per_query],
        ),
    )


def analysis_step(
    args: AnalysisSettings, templates: Sequence[k8s.apiextensions.CustomResource]
) -> dict[str, Any]:
    """A canary step running ``templates``, with the colours Argo reads from the ReplicaSets."""
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
