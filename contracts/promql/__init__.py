"""The dashboard, alert rules and rollout-analysis PromQL that the stacks ship and the rollouts
read, in one place that the tests evaluate against a real Prometheus.

Rollout queries are ``string.Template`` texts with explicit placeholders (see
:data:`ROLLOUT_PLACEHOLDERS`), rendered by :func:`render_rollout_query`. Unlike the rest of
``contracts`` this module reads YAML, with PyYAML (a dependency of the package).
"""

from __future__ import annotations

import json
from importlib import resources
from string import Template
from typing import Any

import yaml

__all__ = [
    "ALERTS_FILE",
    "ANY_VERSION",
    "DASHBOARD_FILE",
    "ROLLOUT_ANALYSIS_FILE",
    "ROLLOUT_PLACEHOLDERS",
    "ROLLOUT_QUERY_NAMES",
    "AssetError",
    "asset_text",
    "load_alert_groups",
    "load_dashboard",
    "placeholders_of",
    "render_rollout_query",
    "rollout_queries",
    "rollout_success_conditions",
]

DASHBOARD_FILE = "dashboard.json"
ALERTS_FILE = "alerts.yaml"
ROLLOUT_ANALYSIS_FILE = "rollout_analysis.yaml"
ROLLOUT_QUERY_NAMES = ("success_ratio", "ttft_p95")
ROLLOUT_PLACEHOLDERS = frozenset({"model_id", "colour", "version_matcher"})
"""What a rollout query may name: ``${model_id}``, ``${colour}`` and ``${version_matcher}``, the
last a whole label matcher on ``model_version``."""
ANY_VERSION = None
"""``model_version`` for :func:`render_rollout_query` that matches every version."""


class AssetError(ValueError):
    """A shipped asset file is malformed, or a query cannot be rendered; the message says which."""


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
    missing = [name for name in ROLLOUT_QUERY_NAMES if name not in section]
    if missing:
        raise AssetError(f"{ROLLOUT_ANALYSIS_FILE}: '{key}' lacks {', '.join(missing)}")
    return {name: value.strip() for name, value in section.items()}


def rollout_queries() -> dict[str, str]:
    """Return the rollout-analysis query templates by name (at least ``success_ratio`` and
    ``ttft_p95``); render them with :func:`render_rollout_query`."""
    return _rollout_section("queries")


def rollout_success_conditions() -> dict[str, str]:
    """Return the Argo Rollouts ``successCondition`` for each rollout query, by the same name."""
    return _rollout_section("success_conditions")


def placeholders_of(query: str) -> set[str]:
    """The placeholders a query template names; raises `AssetError` for a malformed one."""
    template = Template(query)
    if not template.is_valid():
        raise AssetError(f"malformed placeholder in rollout query {query!r}")
    return set(template.get_identifiers())


def render_rollout_query(
    query: str, *, model_id: str, colour: str, model_version: str | None
) -> str:
    """``query`` with its placeholders filled; ``model_version=None`` (:data:`ANY_VERSION`)
    matches every version. Raises `AssetError` naming a placeholder it does not know."""
    unknown = placeholders_of(query) - ROLLOUT_PLACEHOLDERS
    if unknown:
        raise AssetError(
            f"rollout query names {', '.join(sorted(unknown))}; expected only: "
            f"{', '.join(sorted(ROLLOUT_PLACEHOLDERS))}"
        )
    matcher = 'model_version!=""' if model_version is None else f'model_version="{model_version}"'
    return Template(query).substitute(model_id=model_id, colour=colour, version_matcher=matcher)
