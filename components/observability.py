"""``Observability``: the metrics issue's Grafana dashboard and Prometheus alert rules.

The dashboard and rules select series by their ``model_id``/``model_version`` labels, so one
copy per namespace serves every model; a copy per model service would duplicate each alert.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

__all__ = ["DASHBOARD_LABEL", "Observability", "ObservabilityArgs"]

# The Grafana sidecar of kube-prometheus-stack loads ConfigMaps carrying this label.
DASHBOARD_LABEL = "grafana_dashboard"


@dataclass(frozen=True)
class ObservabilityArgs:
    """Inputs: the metrics assets (contract 4) and where to put them."""

    namespace: str
    """Namespace of the ConfigMap and the PrometheusRule."""
    dashboard: Mapping[str, Any]
    """Grafana dashboard JSON model (``load_dashboard()``)."""
    alert_groups: Sequence[Mapping[str, Any]]
    """Prometheus rule groups (``load_alert_groups()``)."""
    depends_on: Sequence[pulumi.Resource] = ()
    """What must exist first: the namespace, the Prometheus operator's CRDs."""


class Observability(pulumi.ComponentResource):
    """A dashboard ConfigMap for Grafana's sidecar and a PrometheusRule for the operator."""

    dashboard_name: pulumi.Output[str]

    def __init__(
        self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        _validate(args)
        super().__init__("llm-serving:observability:Observability", name, None, opts)
        labels = {"app.kubernetes.io/part-of": "llm-serving"}
        # Children do not inherit a component's dependencies: each names them itself.
        child = pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on))
        dashboard = k8s.core.v1.ConfigMap(
            f"{name}-dashboard",
            metadata={
                "name": f"{name}-dashboard",
                "namespace": args.namespace,
                "labels": {**labels, DASHBOARD_LABEL: "1"},
            },
            data={"llm-serving.json": json.dumps(args.dashboard, sort_keys=True)},
            opts=child,
        )
        rules = k8s.apiextensions.CustomResource(
            f"{name}-alerts",
            api_version="monitoring.coreos.com/v1",
            kind="PrometheusRule",
            metadata={"name": f"{name}-alerts", "namespace": args.namespace, "labels": labels},
            spec={"groups": [dict(group) for group in args.alert_groups]},
            opts=child,
        )
        self.dashboard_name = dashboard.metadata.name
        self.register_outputs({"dashboard": self.dashboard_name, "alert_rules": rules.id})


def _validate(args: ObservabilityArgs) -> None:
    if "panels" not in args.dashboard:
        raise ValueError("dashboard: expected a Grafana dashboard model with 'panels'")
    for i, group in enumerate(args.alert_groups):
        if not group.get("name") or not isinstance(group.get("rules"), list):
            raise ValueError(f"alert_groups[{i}]: expected a rule group with 'name' and 'rules'")
