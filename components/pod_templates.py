"""Copies of pod templates that a rollout component adapts (Pulumi Outputs inside are shared)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contracts.labels import COLOUR_ENV, POD_HASH_LABEL

__all__ = ["copy_tree", "with_colour_env"]


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
