"""Every PromQL expression the shipped assets contain, with template variables filled in."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.promql import (
    load_alert_groups,
    load_dashboard,
    render_rollout_query,
    rollout_queries,
)

__all__ = ["Expression", "alert_expressions", "all_expressions", "dashboard_expressions"]


@dataclass(frozen=True)
class Expression:
    """One query: where it comes from (for failure messages) and its PromQL."""

    origin: str
    promql: str


def dashboard_expressions(
    model_id: str, rate_interval: str = "1m", model_version: str = ".*", colour: str = ".*"
) -> list[Expression]:
    """Panel targets with Grafana's variables replaced the way Grafana would."""
    # Longest names first so `$model_id` never eats the start of a longer variable.
    values = {
        "$__rate_interval": rate_interval,
        "$model_version": model_version,
        "$model_id": model_id,
        "$colour": colour,
    }
    found = []
    for panel in load_dashboard()["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in values.items():
                expr = expr.replace(name, value)
            found.append(Expression(f"dashboard:{panel['title']}:{target['refId']}", expr))
    return found


def alert_expressions() -> list[Expression]:
    """Each alert rule's ``expr``."""
    return [
        Expression(f"alert:{rule['alert']}", rule["expr"])
        for group in load_alert_groups()
        for rule in group["rules"]
        if "alert" in rule
    ]


def rollout_expressions(model_id: str, model_version: str, colour: str) -> list[Expression]:
    """Rollout-analysis queries with their placeholders filled."""
    return [
        Expression(
            f"rollout:{name}",
            render_rollout_query(
                query, model_id=model_id, colour=colour, model_version=model_version
            ),
        )
        for name, query in rollout_queries().items()
    ]


def all_expressions(model_id: str, model_version: str, colour: str) -> list[Expression]:
    """Dashboard, alert and rollout expressions together."""
    return (
        dashboard_expressions(model_id)
        + alert_expressions()
        + rollout_expressions(model_id, model_version, colour)
    )
