"""Validators for Kubernetes workloads: GPU tolerations and startup probes, pinned images, the
serving image's Triton/vLLM pair, and Red-Black rollout steps."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from contracts.labels import GPU_RESOURCE, TRITON_ANNOTATION, VLLM_ANNOTATION
from policy.findings import (
    Props,
    containers_of,
    pod_template_of,
    resource_label,
)

__all__ = [
    "ROLLOUT_TYPE",
    "check_gpu_pods_tolerate_taint",
    "check_gpu_startup_probes",
    "check_images_pinned",
    "check_red_black_steps",
    "check_serving_pair_supported",
]

ROLLOUT_TYPE = "kubernetes:argoproj.io/v1alpha1:Rollout"

_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
# A release tag starts with a version number: 25.09, v1.2.3, 26.08-vllm-python-py3.
_TRITON_TAG = re.compile(r":[^/@]*triton(\d{2}\.\d{2})(?![\d.])")
_RELEASE_TAG = re.compile(r"^v?\d+(\.\d+)*([.-][A-Za-z0-9_.-]+)?$")


def _quantity(value: Any) -> int:
    # The engine hands numbers as floats (0.0), manifests may give strings ("1"); what cannot be
    # read as a number still asks for a GPU.
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):
        return 1


def _gpu_count(container: Props) -> int:
    resources = container.get("resources") or {}
    best = 0
    for key in ("limits", "requests"):
        value = (resources.get(key) or {}).get(GPU_RESOURCE)
        if value is not None:
            best = max(best, _quantity(value))
    return best


def _gpu_containers(template: Props) -> list[Props]:
    return [c for c in containers_of(template) if _gpu_count(c) > 0]


def _tolerates_gpu_taint(toleration: Props) -> bool:
    # Kubernetes' matching against the platform's taint {key: nvidia.com/gpu, effect: NoSchedule}
    # (no value): an empty effect matches every effect, the operator defaults to Equal, Exists
    # without a key tolerates every taint, Equal matches only the taint's (empty) value.
    if toleration.get("effect") not in (None, "", "NoSchedule"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return key in ("", GPU_RESOURCE)
    return operator == "Equal" and key == GPU_RESOURCE and not toleration.get("value")


def check_gpu_pods_tolerate_taint(resource_type: str, props: Props) -> list[str]:
    """Pods requesting ``nvidia.com/gpu`` must tolerate the GPU nodes' NoSchedule taint."""
    template = pod_template_of(resource_type, props)
    if template is None or not _gpu_containers(template):
        return []
    tolerations = (template.get("spec") or {}).get("tolerations") or []
    if any(isinstance(t, Mapping) and _tolerates_gpu_taint(t) for t in tolerations):
        return []
    return [
        f"{resource_label(resource_type, props)} requests {GPU_RESOURCE} but does not tolerate "
        f"the GPU taint; add spec.tolerations: [{{key: {GPU_RESOURCE}, operator: Exists, "
        "effect: NoSchedule}]"
    ]


def check_gpu_startup_probes(resource_type: str, props: Props) -> list[str]:
    """Every GPU container needs a startup probe so slow model loads are not killed."""
    template = pod_template_of(resource_type, props)
    if template is None:
        return []
    spec = template.get("spec") or {}
    init_names = {c.get("name") for c in spec.get("initContainers") or []}
    return [
        f"{resource_label(resource_type, props)}: GPU container {c.get('name')!r} has no "
        "startupProbe; add one sized for the model's cold start (failureThreshold x periodSeconds)"
        for c in _gpu_containers(template)
        if c.get("name") not in init_names and not c.get("startupProbe")
    ]


def image_problem(image: str) -> str | None:
    """Why an image reference is not pinned, or ``None`` when it is (digest or release tag)."""
    if _DIGEST.search(image):
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag (it means latest)"
    tag = last.rsplit(":", 1)[1]
    if tag == "latest":
        return "uses the tag latest"
    if not _RELEASE_TAG.match(tag):
        return f"uses tag {tag!r}, which is not a release tag (e.g. 26.08 or v1.2.3)"
    return None


def check_images_pinned(resource_type: str, props: Props) -> list[str]:
    """Images must be pinned by ``@sha256:`` digest or a release tag, never ``latest``."""
    template = pod_template_of(resource_type, props)
    if template is None:
        return []
    messages = []
    for container in containers_of(template):
        image = container.get("image")
        if not isinstance(image, str):
            continue
        problem = image_problem(image)
        if problem is not None:
            messages.append(
                f"{resource_label(resource_type, props)}: container {container.get('name')!r} "
                f"image {image!r} {problem}; pin it by @sha256 digest or a release tag"
            )
    return messages


def check_serving_pair_supported(
    resource_type: str, props: Props, pairs: Collection[tuple[str, str]]
) -> list[str]:
    """A GPU pod's Triton/vLLM pair must be one ``compat.toml`` lists.

    The pair comes from the pod annotations; without them, from a serving image tagged
    ``...-triton<release>`` (the image is built for the matrix's pair of that release).
    """
    template = pod_template_of(resource_type, props)
    if template is None or not _gpu_containers(template):
        return []
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    triton, vllm = annotations.get(TRITON_ANNOTATION), annotations.get(VLLM_ANNOTATION)
    label = resource_label(resource_type, props)
    supported = ", ".join(f"{t}/{v}" for t, v in sorted(pairs)) or "none"
    if triton and vllm:
        if (str(triton), str(vllm)) in set(pairs):
            return []
        return [
            f"{label}: Triton {triton} with vLLM {vllm} is not a pair listed in "
            f"images/compat.toml; supported: {supported}"
        ]
    releases = {
        match.group(1)
        for container in _gpu_containers(template)
        if (match := _TRITON_TAG.search(str(container.get("image") or "")))
    }
    if not releases:
        return [
            f"{label}: cannot tell the serving image's Triton/vLLM pair; add annotations "
            f"{TRITON_ANNOTATION} and {VLLM_ANNOTATION} (or tag the image ...-triton<release>)"
        ]
    listed = {t for t, _ in pairs}
    return [
        f"{label}: Triton {release} is not a release listed in images/compat.toml; "
        f"supported: {supported}"
        for release in sorted(releases - listed)
    ]


def _step_kind(step: Mapping) -> str:
    for kind in ("setWeight", "analysis", "pause", "experiment", "setCanaryScale"):
        if kind in step:
            return kind
    return next(iter(step), "empty")


def _integer_weight(value: Any) -> int | None:
    # Argo Rollouts types setWeight as an int32, so the API server rejects a string, even "50".
    # The engine hands every number as a float (50.0); only a whole one is an integer.
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def check_red_black_steps(resource_type: str, props: Props) -> list[str]:
    """A Rollout's canary steps set integer weights ending at 100, each followed by an analysis."""
    if resource_type != ROLLOUT_TYPE:
        return []
    label = resource_label(resource_type, props)
    canary = ((props.get("spec") or {}).get("strategy") or {}).get("canary")
    if not isinstance(canary, Mapping):
        return [f"{label}: spec.strategy.canary is missing; Red-Black rollouts use the canary"]
    steps = [s for s in canary.get("steps") or [] if isinstance(s, Mapping)]
    weights = [(i, s["setWeight"]) for i, s in enumerate(steps) if "setWeight" in s]
    if not weights:
        return [
            f"{label}: spec.strategy.canary.steps has no setWeight step; end with setWeight 100"
        ]
    messages = [
        f"{label}: steps[{index}].setWeight is {weight!r}, not an integer; write a whole "
        "number from 0 to 100, unquoted (setWeight: 50)"
        for index, weight in weights
        if _integer_weight(weight) is None
    ]
    last = _integer_weight(weights[-1][1])
    if last is not None and last != 100:
        messages.append(f"{label}: the last setWeight is {last}; Red-Black steps must end at 100")
    for n, (index, weight) in enumerate(weights):
        end = weights[n + 1][0] if n + 1 < len(weights) else len(steps)
        following = [_step_kind(s) for s in steps[index + 1 : end]]
        if "analysis" not in following and not canary.get("analysis"):
            messages.append(
                f"{label}: steps[{index}] (setWeight {weight}) is not followed by an analysis "
                "step before the next weight change"
            )
    return messages
