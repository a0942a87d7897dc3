"""Observability: the dashboard ConfigMap for Grafana's sidecar and the PrometheusRule."""

from __future__ import annotations

import json

import pytest

from components.observability import DASHBOARD_LABEL, Observability, ObservabilityArgs
from stacks.kubernetes_objects import validate_object
from tests.components.declared import Declare

DASHBOARD = {"title": "llm-serving", "panels": [{"type": "timeseries", "title": "TTFT"}]}
GROUPS = [
    {
        "name": "llm-serving",
        "rules": [{"alert": "QueueBacklog", "expr": "sum(vllm:num_requests_waiting) > 10"}],
    }
]


def test_dashboard_and_rules_are_shipped(declare: Declare) -> None:
    declared = declare(
        lambda: Observability(
            "obs", ObservabilityArgs(namespace="serving", dashboard=DASHBOARD, alert_groups=GROUPS)
        )
    )
    config_map = declared.one("kubernetes:core/v1:ConfigMap").inputs
    assert config_map["metadata"]["labels"][DASHBOARD_LABEL] == "1"
    assert json.loads(config_map["data"]["llm-serving.json"]) == DASHBOARD
    rule = declared.one("kubernetes:monitoring.coreos.com/v1:PrometheusRule").inputs
    assert rule["spec"]["groups"] == GROUPS
    for manifest in (config_map, rule):
        assert validate_object(manifest)[1] is None


@pytest.mark.parametrize(
    ("dashboard", "groups", "message"),
    [
        ({"title": "x"}, GROUPS, "dashboard: expected a Grafana dashboard model"),
        (DASHBOARD, [{"name": "g"}], r"alert_groups\[0\]: expected a rule group"),
    ],
)
def test_malformed_assets_are_refused(dashboard: dict, groups: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Observability(
            "obs", ObservabilityArgs(namespace="s", dashboard=dashboard, alert_groups=groups)
        )
