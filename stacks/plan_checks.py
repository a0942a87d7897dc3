"""Cross-object checks over a plan: what no single object's schema sees and ``pulumi up`` (or
the cluster after it) would meet: routes sharing a hostname on one listener, routes to
missing Services or ports, claims that bind no volume, IRSA annotations whose role does not
trust the service account, GPU pods and pods pinned to a node group that cannot land there;
and labels the API server refuses, which the schema types only as strings."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from contracts.labels import NODE_GROUP_LABEL
from stacks.instance_types import allocatable, instance_specs
from stacks.kubernetes_objects import kubernetes_objects
from stacks.mock_engine import COMPUTED, ProgramRun, RecordedResource

__all__ = [
    "CHECKS",
    "Finding",
    "check_plan",
    "claims_bind",
    "irsa_roles",
    "label_syntax",
    "pinned_pods_fit",
    "route_backends",
    "route_hostnames",
]

_ROUTE_KINDS = ("HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute", "UDPRoute")
_WORKLOADS = ("Deployment", "Rollout", "StatefulSet", "DaemonSet", "Job")
_GPU = "nvidia.com/gpu"
_IRSA = "eks.amazonaws.com/role-arn"
_TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute"}
_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
Manifest = dict[str, Any]
# apimachinery's IsQualifiedName and IsValidLabelValue (pkg/util/validation).
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class Finding:
    """One problem a check found: ``check`` names the check, ``message`` what to change."""

    check: str
    message: str


def _manifests(run: ProgramRun) -> list[Manifest]:
    return [manifest for _, manifest in kubernetes_objects(run)]


def _meta(manifest: Mapping[str, Any]) -> tuple[str, str]:
    metadata = manifest.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def _ident(manifest: Mapping[str, Any]) -> str:
    namespace, name = _meta(manifest)
    return (
        f"{manifest.get('kind')} {namespace}/{name}" if namespace else f"{manifest['kind']} {name}"
    )


def _of_kind(manifests: list[Manifest], *kinds: str) -> Iterator[Manifest]:
    return (m for m in manifests if m.get("kind") in kinds)


def route_hostnames(run: ProgramRun) -> list[str]:
    """No two routes claim one hostname on one Gateway listener (a route without hostnames
    claims ``*``): Gateway API accepts only one of a GRPCRoute and an HTTPRoute that do, and
    Envoy Gateway does not enforce it, so which backend answers would be undefined."""
    manifests = _manifests(run)
    listeners: dict[tuple[str, str], list[str]] = {}
    for gateway in _of_kind(manifests, "Gateway"):
        spec = gateway.get("spec") or {}
        listeners[_meta(gateway)] = [str(entry.get("name")) for entry in spec.get("listeners", [])]
    claims: dict[tuple[str, str, str, str], list[str]] = {}
    for route in _of_kind(manifests, *_ROUTE_KINDS):
        namespace, _ = _meta(route)
        spec = route.get("spec") or {}
        hostnames = spec.get("hostnames") or ["*"]
        for ref in spec.get("parentRefs") or []:
            if ref.get("kind", "Gateway") != "Gateway":
                continue
            ns, name = str(ref.get("namespace") or namespace), str(ref.get("name"))
            section = ref.get("sectionName")
            for listener in [section] if section else listeners.get((ns, name), ["*"]):
                for hostname in hostnames:
                    owners = claims.setdefault((ns, name, str(listener), str(hostname)), [])
                    if _ident(route) not in owners:
                        owners.append(_ident(route))
    return [
        f"Gateway {ns}/{name} listener {listener!r}: hostname {hostname!r} is claimed by "
        f"{' and '.join(owners)}; give each route its own hostname or listener"
        for (ns, name, listener, hostname), owners in sorted(claims.items())
        if len(owners) > 1
    ]


def route_backends(run: ProgramRun) -> list[str]:
    """Every route's Service backends exist in the plan, each with a port the Service has."""
    manifests = _manifests(run)
    services = {_meta(s): s for s in _of_kind(manifests, "Service")}
    problems = []
    for route in _of_kind(manifests, *_ROUTE_KINDS):
        namespace, _ = _meta(route)
        for rule in (route.get("spec") or {}).get("rules") or []:
            for ref in rule.get("backendRefs") or []:
                if ref.get("group", "") != "" or ref.get("kind", "Service") != "Service":
                    continue
                key = (str(ref.get("namespace") or namespace), str(ref.get("name")))
                service = services.get(key)
                if service is None:
                    problems.append(
                        f"{_ident(route)}: backend Service {key[0]}/{key[1]} is not in the plan"
                    )
                    continue
                ports = [p.get("port") for p in (service.get("spec") or {}).get("ports") or []]
                if ref.get("port") not in ports:
                    problems.append(
                        f"{_ident(route)}: backend {_ident(service)} has no port "
                        f"{ref.get('port')!r} (it has {ports}); name one of its ports"
                    )
    return problems


def _storage(text: Any) -> float:
    """A Kubernetes quantity (``2400Gi``, ``250m``, ``6``) as a number of units."""
    value = str(text)
    if value.endswith("m"):
        return float(value[:-1]) / 1000
    for suffix, factor in _SUFFIXES.items():
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def claims_bind(run: ProgramRun) -> list[str]:
    """Every PVC a pod mounts is in the plan, and every PVC binds its PV: the PV exists with the
    claim's storage class, access modes and at least its size, and is not claimed by another."""
    manifests = _manifests(run)
    volumes = {_meta(v)[1]: v for v in _of_kind(manifests, "PersistentVolume")}
    claims = {_meta(c): c for c in _of_kind(manifests, "PersistentVolumeClaim")}
    problems = []
    for key, claim in sorted(claims.items()):
        spec = claim.get("spec") or {}
        name = spec.get("volumeName")
        volume = volumes.get(str(name))
        if volume is None:
            problems.append(f"{_ident(claim)}: volumeName {name!r} names no PersistentVolume")
            continue
        pv = volume.get("spec") or {}
        # An unset class takes the cluster's default class, which a static PV ("") never has.
        wanted_class = spec.get("storageClassName", "(the default class)")
        if wanted_class != pv.get("storageClassName", ""):
            problems.append(
                f"{_ident(claim)}: storageClassName {wanted_class!r} differs from "
                f"{_ident(volume)}'s {pv.get('storageClassName', '')!r}; the claim never binds"
            )
        missing = set(spec.get("accessModes") or []) - set(pv.get("accessModes") or [])
        if missing:
            problems.append(
                f"{_ident(claim)}: {_ident(volume)} lacks access modes {sorted(missing)}"
            )
        request = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "0")
        capacity = (pv.get("capacity") or {}).get("storage", "0")
        if _storage(request) > _storage(capacity):
            problems.append(
                f"{_ident(claim)}: requests {request}, more than {_ident(volume)}'s {capacity}"
            )
        ref = pv.get("claimRef")
        if ref and (ref.get("namespace"), ref.get("name")) != key:
            problems.append(f"{_ident(volume)} is reserved for {ref}, not {_ident(claim)}")
    for workload, pod in _pods(manifests):
        namespace, _ = _meta(workload)
        for volume in pod.get("volumes") or []:
            claim_name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim_name is not None and (namespace, claim_name) not in claims:
                problems.append(
                    f"{_ident(workload)}: volume {volume.get('name')!r} mounts the claim "
                    f"{namespace}/{claim_name}, which is not in the plan"
                )
    return problems


def _pods(manifests: list[Manifest]) -> Iterator[tuple[Manifest, Manifest]]:
    """``(workload, pod spec)`` of every workload (its pod template's spec)."""
    for workload in _of_kind(manifests, *_WORKLOADS):
        template = (workload.get("spec") or {}).get("template") or {}
        yield workload, template.get("spec") or {}


def irsa_roles(run: ProgramRun) -> list[str]:
    """Every IRSA annotation names an IAM role of the plan whose trust policy lets exactly that
    service account assume it (where the plan knows the policy: a created cluster's OIDC issuer
    is computed until the cluster exists)."""
    by_urn = {r.urn: r for r in run.resources}
    problems = []
    for resource, account in kubernetes_objects(run):
        annotations = (account.get("metadata") or {}).get("annotations") or {}
        if account.get("kind") != "ServiceAccount" or _IRSA not in annotations:
            continue
        roles = _annotated_roles(resource, annotations[_IRSA], run, by_urn)
        if not roles:
            problems.append(
                f"{_ident(account)}: {_IRSA} {annotations[_IRSA]!r} names no IAM role in the plan"
            )
            continue
        namespace, name = _meta(account)
        subject = f"system:serviceaccount:{namespace}:{name}"
        for role in roles:
            policy = role.inputs.get("assumeRolePolicy")
            if policy == COMPUTED or (isinstance(policy, str) and COMPUTED in policy):
                continue
            if subject not in _trusted_subjects(policy):
                problems.append(
                    f"{_ident(account)}: role {role.name} does not trust {subject} "
                    "(sts:AssumeRoleWithWebIdentity with a :sub condition naming it)"
                )
    return problems


def _annotated_roles(
    resource: RecordedResource,
    arn: str,
    run: ProgramRun,
    by_urn: Mapping[str, RecordedResource],
) -> list[RecordedResource]:
    roles = [r for r in run.resources if r.type == "aws:iam/role:Role"]
    if arn != COMPUTED:
        role_name = arn.rsplit("/", 1)[-1]
        return [r for r in roles if r.inputs.get("name") == role_name]
    # A computed ARN comes from the role it depends on.
    urns = resource.property_dependencies.get("metadata") or []
    return [by_urn[u] for u in urns if u in by_urn and by_urn[u].type == "aws:iam/role:Role"]


def _trusted_subjects(policy: Any) -> set[str]:
    document = json.loads(policy) if isinstance(policy, str) else policy or {}
    subjects: set[str] = set()
    for statement in document.get("Statement") or []:
        if statement.get("Action") != "sts:AssumeRoleWithWebIdentity":
            continue
        for test in (statement.get("Condition") or {}).values():
            for key, value in test.items():
                if key.endswith(":sub"):
                    subjects.update([value] if isinstance(value, str) else value)
    return subjects


def _requests(pod: Mapping[str, Any]) -> dict[str, float]:
    total = {"cpu": 0.0, "memory": 0.0, _GPU: 0.0}
    for container in pod.get("containers") or []:
        resources = container.get("resources") or {}
        # Requests default to limits when only limits are set.
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for key in total:
            if key in wanted:
                total[key] += _storage(wanted[key])
    return total


def _tolerated(taint: Mapping[str, Any], tolerations: list[Mapping[str, Any]]) -> bool:
    effect = _TAINT_EFFECTS.get(str(taint.get("effect")))
    for toleration in tolerations:
        exists = toleration.get("operator") == "Exists"
        key_ok = toleration.get("key") == taint.get("key") or (exists and not toleration.get("key"))
        value_ok = exists or toleration.get("value", "") == taint.get("value", "")
        if key_ok and value_ok and toleration.get("effect") in (None, "", effect):
            return True
    return False


def pinned_pods_fit(run: ProgramRun) -> list[str]:
    """Every GPU pod, and every pod whose nodeSelector names a node group (CPU models), selects
    a node group of the plan, tolerates its taints and fits each of its instance types after the
    node's reserved capacity (``stacks/instance_types.py``)."""
    groups = [r.inputs for r in run.resources if r.type == "aws:eks/nodeGroup:NodeGroup"]
    specs = instance_specs()
    problems = []
    for workload, pod in _pods(_manifests(run)):
        wanted = _requests(pod)
        selector = pod.get("nodeSelector") or {}
        if not wanted[_GPU] and NODE_GROUP_LABEL not in selector:
            continue
        matching = [g for g in groups if selector.items() <= (g.get("labels") or {}).items()]
        if not matching:
            problems.append(f"{_ident(workload)}: no node group of the plan has labels {selector}")
        for group in matching:
            where = f"{_ident(workload)} on node group {group.get('nodeGroupName') or selector}"
            for taint in group.get("taints") or []:
                if taint.get("effect") in _TAINT_EFFECTS and not _tolerated(
                    taint, pod.get("tolerations") or []
                ):
                    problems.append(f"{where}: does not tolerate the taint {taint}")
            for name in group.get("instanceTypes") or []:
                if name not in specs:
                    problems.append(f"{where}: {name} is not in stacks/instance_types.yaml")
                    continue
                free = allocatable(specs[name])
                have = {
                    "cpu": free.cpu_milli / 1000,
                    "memory": free.memory_mib * 2**20,
                    _GPU: float(free.gpus),
                }
                short = [k for k in have if wanted[k] > have[k]]
                if short:
                    problems.append(
                        f"{where}: does not fit {name} ({', '.join(short)} above what the node "
                        "leaves after its reserved capacity)"
                    )
    return problems


def _label_problem(key: str, value: Any) -> str | None:
    prefix, _, name = key.rpartition("/")
    bad_prefix = bool(prefix) and (len(prefix) > 253 or not _LABEL_PREFIX.match(prefix))
    if bad_prefix or not _LABEL_NAME.match(name):
        return f"label key {key!r} is not a qualified name ([prefix/]name, name 1-63 characters)"
    text = str(value)
    if value == COMPUTED or text == "" or _LABEL_NAME.match(text):
        return None
    return (
        f"label {key}={text!r} is not a valid label value (at most 63 of A-Z, a-z, 0-9, "
        "'-', '_', '.', beginning and ending with a letter or digit)"
    )


def _label_sets(manifest: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(where, labels)`` of an object's labels, its pod template's and its selector's."""
    yield "metadata.labels", (manifest.get("metadata") or {}).get("labels") or {}
    spec = manifest.get("spec") or {}
    if not isinstance(spec, Mapping):
        return
    template = spec.get("template") or {}
    if isinstance(template, Mapping):
        yield "spec.template.metadata.labels", (template.get("metadata") or {}).get("labels") or {}
    selector = spec.get("selector") or {}
    if manifest.get("kind") == "Service":
        yield "spec.selector", selector
    elif isinstance(selector, Mapping):
        yield "spec.selector.matchLabels", selector.get("matchLabels") or {}


def label_syntax(run: ProgramRun) -> list[str]:
    """Every label key and value of every object (its own, its pod template's, its selector's)
    is one the API server accepts: it refuses the whole object otherwise, and neither the
    built-in schemas nor the custom resources' shape check look at them."""
    problems = []
    for manifest in _manifests(run):
        for where, labels in _label_sets(manifest):
            if not isinstance(labels, Mapping):
                continue
            for key, value in sorted(labels.items()):
                problem = _label_problem(str(key), value)
                if problem is not None:
                    problems.append(f"{_ident(manifest)}: {where}: {problem}")
    return problems


CHECKS: dict[str, Callable[[ProgramRun], list[str]]] = {
    "route hostnames": route_hostnames,
    "route backends": route_backends,
    "claims bind": claims_bind,
    "IRSA roles": irsa_roles,
    "pods fit their node group": pinned_pods_fit,
    "label syntax": label_syntax,
}
"""Every cross-object check by name; each returns one message per problem."""


def check_plan(run: ProgramRun) -> list[Finding]:
    """Run every check of :data:`CHECKS` over ``run``."""
    return [Finding(name, message) for name, check in CHECKS.items() for message in check(run)]
