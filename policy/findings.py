"""Helpers shared by the validators: reading Pulumi resource properties as plain dicts.

Validators receive the engine's view of a resource: its type token (``aws:eks/nodeGroup:NodeGroup``,
``kubernetes:apps/v1:Deployment``) and its input properties with camelCase keys, exactly as
CrossGuard's ``ResourceValidationArgs.props`` holds them. Every validator returns a list of
violation messages; an empty list means the resource passes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "WORKLOAD_TYPES",
    "Props",
    "containers_of",
    "pod_template_of",
    "resource_label",
]

Props = Mapping[str, Any]

# Kubernetes types whose pods the policies inspect, and where their pod template lives.
WORKLOAD_TYPES: dict[str, tuple[str, ...]] = {
    "kubernetes:core/v1:Pod": (),
    "kubernetes:apps/v1:Deployment": ("spec", "template"),
    "kubernetes:apps/v1:StatefulSet": ("spec", "template"),
    "kubernetes:apps/v1:DaemonSet": ("spec", "template"),
    "kubernetes:apps/v1:ReplicaSet": ("spec", "template"),
    "kubernetes:batch/v1:Job": ("spec", "template"),
    "kubernetes:batch/v1:CronJob": ("spec", "jobTemplate", "spec", "template"),
    "kubernetes:argoproj.io/v1alpha1:Rollout": ("spec", "template"),
}


def _get(value: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def pod_template_of(resource_type: str, props: Props) -> Props | None:
    """The pod (metadata + spec) of a workload, or ``None`` for any other resource type."""
    path = WORKLOAD_TYPES.get(resource_type)
    if path is None:
        return None
    template = _get(props, *path) if path else props
    return template if isinstance(template, Mapping) else None


def containers_of(template: Props) -> Iterator[Props]:
    """Every container and init container of a pod template."""
    spec = template.get("spec") or {}
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            if isinstance(container, Mapping):
                yield container


def resource_label(resource_type: str, props: Props) -> str:
    """A short name for messages: the Kubernetes kind and metadata.name when known."""
    name = _get(props, "metadata", "name")
    kind = resource_type.rsplit(":", 1)[-1]
    return f"{kind} {name}" if name else kind
