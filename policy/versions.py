"""Advisory validator: Versioned deployments older than the idle window should be reviewed."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from contracts.labels import (
    CREATED_AT_ANNOTATION,
    MODEL_VERSION_LABEL,
    NEWEST_ANNOTATION,
    ROUTE_WEIGHT_ANNOTATION,
    STRATEGY_LABEL,
)
from policy.findings import Props

__all__ = ["check_versioned_age"]


def check_versioned_age(
    resource_type: str, props: Props, *, idle: timedelta, now: datetime
) -> list[str]:
    """Flag an older Versioned Service created more than ``idle`` ago, unless it carries a route
    weight, which keeps it out of ``versions gc`` at any age."""
    if resource_type != "kubernetes:core/v1:Service":
        return []
    metadata = props.get("metadata") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    if labels.get(STRATEGY_LABEL) != "versioned" or annotations.get(NEWEST_ANNOTATION) == "true":
        return []
    if ROUTE_WEIGHT_ANNOTATION in annotations:
        return []
    created = annotations.get(CREATED_AT_ANNOTATION)
    if not created:
        return []
    try:
        created_at = _created_at(str(created))
    except ValueError:
        return [f"{CREATED_AT_ANNOTATION} {created!r} is not an ISO 8601 timestamp"]
    age = now - created_at
    if age <= idle:
        return []
    version = labels.get(MODEL_VERSION_LABEL, "?")
    window = _gc_duration(idle)
    return [
        f"Versioned deployment {metadata.get('name')} (version {version}) is {age.days} days old, "
        f"beyond the idle window of {window}; run `llm-serving versions gc --stack <stack> "
        f"--prometheus <url> --idle {window}` to see whether it is idle, and with --apply to "
        "retire it"
    ]


def _created_at(value: str) -> datetime:
    try:
        day = date.fromisoformat(value)
    except ValueError:
        created_at = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return created_at if created_at.tzinfo else created_at.replace(tzinfo=UTC)
    # A day (the stack's created_at): deployed by its end at the latest, as versions gc reads it.
    return datetime.combine(day + timedelta(days=1), time(), UTC)


def _gc_duration(idle: timedelta) -> str:
    # Spelled as `versions gc --idle` takes it (whole hours or minutes), not as timedelta's str.
    minutes = max(1, round(idle.total_seconds() / 60))
    return f"{minutes // 60}h" if minutes % 60 == 0 else f"{minutes}m"
