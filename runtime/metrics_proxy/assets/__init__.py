"""The dashboard, alert rules and rollout-analysis PromQL that ship beside the metrics proxy.

Components and the rollout analysis read them through these loaders, so every query lives in
one file that the tests evaluate against a real Prometheus.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import yaml

__all__ = [
    "ALERTS_FILE",
    "DASHBOARD_FILE",
    "ROLLOUT_ANALYSIS_FILE",
    "AssetError",
    "asset_text",
    "load_alert_groups",
    "load_dashboard",
    "rollout_queries",
    "rollout_success_conditions",
]

DASHBOARD_FILE = "dashboard.json"
ALERTS_FILE = "alerts.yaml"
ROLLOUT_ANALYSIS_FILE = "rollout_analysis.yaml"
_REQUIRED_ROLLOUT_QUERIES = ("success_ratio", "ttft_p95")


class AssetError(ValueError):
    """A shipped asset file is malformed; the message names the file and the field."""


def asset_text(name: str) -> str:
    """Return the text of one asset file (``dashboard.json``, ``alerts.yaml``, ...)."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def load_dashboard() -> dict[str, Any]:
    """Return the Grafana dashboard (JSON model) for one model service."""
    dashboard = json.loads(asset_text(DASHBOARD_FILE))
    if not isinstance(dashboard, dict) or not isinstance(dashboard.get("panels"), list):
        raise AssetError(f"{DASHBOARD_FILE}: expected an object with a 'panels' list")
    return dashboard


def load_alert_groups() -> list[dict[str, Any]]:
    """Return the ``groups:`` list of the Prometheus rule file ``alerts.yaml``."""
    document = yaml.safe_load(asset_text(ALERTS_FILE))
    groups = document.get("groups") if isinstance(document, dict) else None
    if not isinstance(groups, list) or not groups:
        raise AssetError(f"{ALERTS_FILE}: expected a non-empty 'groups' list")
    return groups


def _rollout_section(key: str) -> dict[str, str]:
    document = yaml.safe_load(asset_text(ROLLOUT_ANALYSIS_FILE))
    section = document.get(key) if isinstance(document, dict) else None
    if not isinstance(section, dict) or not all(isinstance(v, str) for v in section.values()):
        raise AssetError(f"{ROLLOUT_ANALYSIS_FILE}: '{key}' must map names to strings")
    missing = [name for name in _REQUIRED_ROLLOUT_QUERIES if name not in section]
    if missing:
        raise AssetError(f"{ROLLOUT_ANALYSIS_FILE}: '{key}' lacks {', '.join(missing)}")
    return {name: value.strip() for name, value in section.items()}


def rollout_queries() -> dict[str, str]:
    """Return the rollout-analysis PromQL by name (at least ``success_ratio``, ``ttft_p95``).

    Queries carry Argo Rollouts placeholders ``{{args.model_id}}``, ``{{args.model_version}}``
    and ``{{args.colour}}`` for the AnalysisTemplate to fill.
    """
    return _rollout_section("queries")


def rollout_success_conditions() -> dict[str, str]:
    """Return the Argo Rollouts ``successCondition`` for each rollout query, by the same name."""
    return _rollout_section("success_conditions")
