"""Validators for AWS resources: tainted GPU node groups, IMDSv2, encrypted and private FSx,
and IRSA roles scoped to one service account and one S3 prefix."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from policy.findings import GPU_RESOURCE, Props

__all__ = [
    "BUCKET_CONFIGURATION_READS",
    "LUSTRE_PORTS",
    "check_fsx_encrypted",
    "check_gpu_node_group_tainted",
    "check_imdsv2_required",
    "check_irsa_trust_scoped",
    "check_lustre_not_public",
    "check_s3_access_scoped_to_prefix",
]

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SECURITY_GROUP_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
ROLE = "aws:iam/role:Role"
POLICY_DOCUMENT_TYPES = ("aws:iam/rolePolicy:RolePolicy", "aws:iam/policy:Policy")

# Lustre's LNet port and the range its clients and servers use (AWS FSx for Lustre docs).
LUSTRE_PORTS: tuple[tuple[int, int], ...] = ((988, 988), (1018, 1023))
PUBLIC_CIDRS = frozenset({"0.0.0.0/0", "::/0"})
# Bucket-level reads of configuration, not of objects: nothing to scope to a prefix.
BUCKET_CONFIGURATION_READS = frozenset(
    {"s3:GetBucketLocation", "s3:GetBucketVersioning", "s3:GetReplicationConfiguration"}
)
_GPU_INSTANCE = re.compile(r"^(p\d|g\d|gr\d)[a-z0-9-]*\.", re.IGNORECASE)


def _is_gpu_node_group(props: Props) -> bool:
    if "NVIDIA" in str(props.get("amiType") or "").upper():
        return True
    return any(_GPU_INSTANCE.match(str(t)) for t in props.get("instanceTypes") or [])


def check_gpu_node_group_tainted(resource_type: str, props: Props) -> list[str]:
    """GPU node groups carry the ``nvidia.com/gpu`` NoSchedule taint so only GPU pods land there."""
    if resource_type != NODE_GROUP or not _is_gpu_node_group(props):
        return []
    for taint in props.get("taints") or []:
        if taint.get("key") == GPU_RESOURCE and taint.get("effect") == "NO_SCHEDULE":
            return []
    return [
        f"GPU node group (amiType {props.get('amiType')}, instanceTypes "
        f"{list(props.get('instanceTypes') or [])}) has no taint {{key: {GPU_RESOURCE}, "
        "effect: NO_SCHEDULE}; add it to taints"
    ]


def check_imdsv2_required(resource_type: str, props: Props) -> list[str]:
    """Launch templates and instances require IMDSv2 session tokens (``httpTokens: required``)."""
    if resource_type not in (LAUNCH_TEMPLATE, INSTANCE):
        return []
    options = props.get("metadataOptions") or {}
    if options.get("httpEndpoint") == "disabled" or options.get("httpTokens") == "required":
        return []
    kind = resource_type.rsplit(":", 1)[-1]
    return [
        f"{kind} allows IMDSv1 (metadataOptions.httpTokens is "
        f"{options.get('httpTokens')!r}); set metadataOptions.httpTokens to 'required'"
    ]


def check_fsx_encrypted(resource_type: str, props: Props) -> list[str]:
    """FSx for Lustre is a persistent deployment encrypted with a customer-managed KMS key."""
    if resource_type != LUSTRE:
        return []
    messages = []
    deployment = str(props.get("deploymentType") or "SCRATCH_1")
    if not deployment.startswith("PERSISTENT"):
        messages.append(
            f"FSx for Lustre deploymentType {deployment} cannot use a customer KMS key; "
            "use PERSISTENT_2"
        )
    if not props.get("kmsKeyId"):
        messages.append("FSx for Lustre has no kmsKeyId; encrypt it with the platform's KMS key")
    return messages


def _opens_lustre(from_port: Any, to_port: Any, protocol: Any) -> bool:
    if str(protocol) in ("-1", "all"):
        return True
    if str(protocol).lower() not in ("tcp", "6"):
        return False
    low, high = int(from_port or 0), int(to_port if to_port is not None else from_port or 0)
    return any(low <= end and start <= high for start, end in LUSTRE_PORTS)


def _public(cidrs: Iterable[Any]) -> list[str]:
    return sorted(str(c) for c in cidrs if str(c) in PUBLIC_CIDRS)


def check_lustre_not_public(resource_type: str, props: Props) -> list[str]:
    """No security group rule opens the Lustre ports (988, 1018-1023) to the internet."""
    rules: list[tuple[Any, Any, Any, list[str]]] = []
    if resource_type == SECURITY_GROUP:
        for rule in props.get("ingress") or []:
            cidrs = [*(rule.get("cidrBlocks") or []), *(rule.get("ipv6CidrBlocks") or [])]
            rules.append((rule.get("fromPort"), rule.get("toPort"), rule.get("protocol"), cidrs))
    elif resource_type == SECURITY_GROUP_RULE and props.get("type") == "ingress":
        cidrs = [*(props.get("cidrBlocks") or []), *(props.get("ipv6CidrBlocks") or [])]
        rules.append((props.get("fromPort"), props.get("toPort"), props.get("protocol"), cidrs))
    elif resource_type == INGRESS_RULE:
        cidrs = [c for c in (props.get("cidrIpv4"), props.get("cidrIpv6")) if c]
        rules.append((props.get("fromPort"), props.get("toPort"), props.get("ipProtocol"), cidrs))
    return [
        f"ingress on ports {low}-{high} ({protocol}) from {', '.join(public)} exposes the Lustre "
        "ports; allow only the node groups' security group"
        for low, high, protocol, cidrs in rules
        if (public := _public(cidrs)) and _opens_lustre(low, high, protocol)
    ]


def _document(value: Any) -> Mapping[str, Any] | None:
    if isinstance(value, Mapping):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        return parsed if isinstance(parsed, Mapping) else None
    return None  # unknown during preview: checked again at update time


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _statements(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [s for s in _as_list(document.get("Statement")) if isinstance(s, Mapping)]


def check_irsa_trust_scoped(resource_type: str, props: Props) -> list[str]:
    """An IRSA role trusts exactly one service account (``:sub`` by StringEquals, no wildcard)."""
    if resource_type != ROLE:
        return []
    document = _document(props.get("assumeRolePolicy"))
    if document is None:
        return []
    messages = []
    for statement in _statements(document):
        actions = [str(a) for a in _as_list(statement.get("Action"))]
        if "sts:AssumeRoleWithWebIdentity" not in actions:
            continue
        equals = (statement.get("Condition") or {}).get("StringEquals") or {}
        subjects = [
            str(v)
            for key, value in equals.items()
            if str(key).endswith(":sub")
            for v in _as_list(value)
        ]
        if not subjects or any(
            "*" in s or not s.startswith("system:serviceaccount:") for s in subjects
        ):
            messages.append(
                "IRSA trust policy must pin '<issuer>:sub' with StringEquals to "
                "'system:serviceaccount:<namespace>:<name>' (no wildcards)"
            )
    return messages


def _object_arn_scoped(arn: str) -> bool:
    if not arn.startswith("arn:aws:s3:::"):
        return False
    bucket_and_key = arn[len("arn:aws:s3:::") :]
    if "/" not in bucket_and_key:
        return False
    bucket, key = bucket_and_key.split("/", 1)
    prefix = key.split("*", 1)[0]
    return "*" not in bucket and prefix.rstrip("/") != "" and prefix.endswith("/")


def check_s3_access_scoped_to_prefix(resource_type: str, props: Props) -> list[str]:
    """S3 permissions name object ARNs under a key prefix; ListBucket needs s3:prefix."""
    if resource_type not in POLICY_DOCUMENT_TYPES:
        return []
    document = _document(props.get("policy"))
    if document is None:
        return []
    messages = []
    for statement in _statements(document):
        if statement.get("Effect") != "Allow":
            continue
        actions = [str(a) for a in _as_list(statement.get("Action"))]
        if not any(a == "*" or a.lower().startswith("s3:") for a in actions):
            continue
        for resource in (str(r) for r in _as_list(statement.get("Resource"))):
            if _object_arn_scoped(resource):
                continue
            bucket_only = resource.startswith("arn:aws:s3:::") and "/" not in resource
            conditions = statement.get("Condition") or {}
            has_prefix = any("s3:prefix" in (c or {}) for c in conditions.values())
            if bucket_only and actions == ["s3:ListBucket"] and has_prefix:
                continue
            if bucket_only and set(actions) <= BUCKET_CONFIGURATION_READS:
                continue
            messages.append(
                f"S3 access {actions} on {resource!r} is not scoped to a key prefix; use "
                "'arn:aws:s3:::<bucket>/models/<model_id>/*' (and s3:ListBucket with an "
                "s3:prefix condition)"
            )
    return messages
