"""Validators for AWS resources: tainted GPU node groups, IMDSv2, encrypted and private FSx,
and IRSA roles scoped to one service account and one S3 prefix."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contracts.labels import GPU_RESOURCE
from policy.findings import Props

__all__ = [
    "BUCKET_CONFIGURATION_READS",
    "LUSTRE_PORTS",
    "PREFIX_SCOPING_OPERATORS",
    "StackResource",
    "check_fsx_encrypted",
    "check_gpu_launch_template_tainted",
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
# The condition operators under which a listing must name one of the given prefixes. A negated
# operator (StringNotLike), an ...IfExists one or ForAllValues also let through a listing that
# names no prefix at all, that is the whole bucket.
PREFIX_SCOPING_OPERATORS = frozenset(
    {"StringEquals", "StringLike", "ForAnyValue:StringEquals", "ForAnyValue:StringLike"}
)
WEB_IDENTITY_ASSUME = "sts:AssumeRoleWithWebIdentity"
# Web identity providers whose tokens no Kubernetes service account holds: an IAM OIDC provider
# of another issuer (GitHub Actions' token.actions.githubusercontent.com), or one STS knows by name.
_OTHER_OIDC_PROVIDER = re.compile(r":oidc-provider/(?!oidc\.eks\b)")
NAMED_WEB_IDENTITY_PROVIDERS = frozenset(
    {
        "cognito-identity.amazonaws.com",
        "accounts.google.com",
        "graph.facebook.com",
        "www.amazon.com",
    }
)
GPU_ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"
_GPU_INSTANCE = re.compile(r"^(p\d|g\d|gr\d)[a-z0-9-]*\.", re.IGNORECASE)


def _gpu_evidence(props: Props) -> str | None:
    # What in the node group's own properties says its nodes have NVIDIA GPUs, or None. A CUSTOM
    # AMI whose launch template alone names GPU instance types says nothing here: that takes the
    # stack view (check_gpu_launch_template_tainted).
    ami_type = str(props.get("amiType") or "")
    if "NVIDIA" in ami_type.upper() or ami_type.upper().endswith("_GPU"):
        return f"amiType {ami_type}"
    gpu_types = [str(t) for t in props.get("instanceTypes") or [] if _GPU_INSTANCE.match(str(t))]
    if gpu_types:
        return f"instanceTypes {gpu_types}"
    labels = props.get("labels") or {}
    for key in labels:
        # The accelerator label is the one cluster-autoscaler reads as "this node has a GPU".
        gpu_label = key.startswith(GPU_RESOURCE) or key == GPU_ACCELERATOR_LABEL
        if gpu_label and str(labels[key]).lower() != "false":
            return f"label {key}"
    for taint in props.get("taints") or []:
        if isinstance(taint, Mapping) and taint.get("key") == GPU_RESOURCE:
            return f"taint {GPU_RESOURCE} with effect {taint.get('effect')}"
    return None


def check_gpu_node_group_tainted(resource_type: str, props: Props) -> list[str]:
    """GPU node groups carry the ``nvidia.com/gpu`` NoSchedule taint so only GPU pods land there.

    A node group is a GPU one by its amiType, instanceTypes, an ``nvidia.com/gpu*`` or
    accelerator label, or an ``nvidia.com/gpu`` taint of any effect.
    """
    evidence = _gpu_evidence(props) if resource_type == NODE_GROUP else None
    if evidence is None:
        return []
    for taint in props.get("taints") or []:
        if taint.get("key") == GPU_RESOURCE and taint.get("effect") == "NO_SCHEDULE":
            return []
    return [
        f"GPU node group ({evidence}) has no taint {{key: {GPU_RESOURCE}, "
        "effect: NO_SCHEDULE}; add it to taints"
    ]


@dataclass(frozen=True)
class StackResource:
    """One resource of a stack as a stack policy sees it."""

    urn: str
    type: str
    name: str
    """The resource's logical name in the program."""
    props: Props
    property_dependencies: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Per property, the URNs of the resources its value depends on."""


def _launch_templates_of(
    node_group: StackResource, resources: Sequence[StackResource]
) -> list[StackResource]:
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    # In a preview launchTemplate.id is the template's unknown output: only the dependency joins
    # them then. The id and name are read only without one, as reading an unknown value raises.
    linked = set(node_group.property_dependencies.get("launchTemplate") or ())
    if by_dependency := [t for t in templates if t.urn in linked]:
        return by_dependency
    reference = node_group.props.get("launchTemplate") or {}
    wanted = {key: reference.get(key) for key in ("id", "name")}
    return [
        t
        for t in templates
        if any(value is not None and t.props.get(key) == value for key, value in wanted.items())
    ]


def check_gpu_launch_template_tainted(
    node_group: StackResource, resources: Sequence[StackResource]
) -> list[str]:
    """A node group whose launch template's instanceType is a GPU type is tainted like any other.

    Only node groups without GPU evidence of their own are checked (``check_gpu_node_group_tainted``
    reports the rest); the template is the one ``launchTemplate`` depends on, or else the one its
    ``id`` or ``name`` names among ``resources``.
    """
    if node_group.type != NODE_GROUP or _gpu_evidence(node_group.props) is not None:
        return []  # any nvidia.com/gpu taint is evidence, so from here the group has none
    return [
        f"GPU node group {node_group.name} (instanceType {instance_type} in launch template "
        f"{template.name}) has no taint {{key: {GPU_RESOURCE}, effect: NO_SCHEDULE}}; add it "
        "to taints"
        for template in _launch_templates_of(node_group, resources)
        if _GPU_INSTANCE.match(instance_type := str(template.props.get("instanceType") or ""))
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


def _lustre_exposure(from_port: Any, to_port: Any, protocol: Any) -> str | None:
    # The ports a rule opens that reach Lustre, as the message shows them, or None.
    if str(protocol) in ("-1", "all"):
        return f"every port and protocol (protocol {protocol})"  # fromPort/toPort do not apply
    if str(protocol).lower() not in ("tcp", "6"):
        return None
    low, high = int(from_port or 0), int(to_port if to_port is not None else from_port or 0)
    if not any(low <= end and start <= high for start, end in LUSTRE_PORTS):
        return None
    return f"TCP port {low}" if low == high else f"TCP ports {low}-{high}"


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
        f"ingress on {opened} from {', '.join(public)} exposes the Lustre ports; allow only the "
        "node groups' security group"
        for low, high, protocol, cidrs in rules
        if (public := _public(cidrs)) and (opened := _lustre_exposure(low, high, protocol))
    ]


def _document(value: Any) -> Mapping[str, Any] | None:
    # pulumi-aws takes a policy as a JSON string or as an object (under the engine a Mapping proxy).
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
    # Any Sequence, so that pulumi-policy's list proxy counts as a list.
    if value is None:
        return []
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    return [value]


def _statements(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [s for s in _as_list(document.get("Statement")) if isinstance(s, Mapping)]


def _iam_pattern(pattern: str) -> re.Pattern[str]:
    # IAM patterns know only * and ?, and action names are case-insensitive.
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.IGNORECASE | re.DOTALL)


def _matches_any(patterns: Iterable[Any], name: str) -> bool:
    return any(_iam_pattern(str(p)).fullmatch(name) for p in patterns)


def _has_wildcard(text: str) -> bool:
    return "*" in text or "?" in text


def _other_identity_provider(principal: str) -> bool:
    return principal in NAMED_WEB_IDENTITY_PROVIDERS or bool(_OTHER_OIDC_PROVIDER.search(principal))


def _may_grant_web_identity(statement: Mapping[str, Any]) -> bool:
    if statement.get("Effect") != "Allow":
        return False
    principal = statement.get("Principal")
    # Only a federated principal (or everyone) can call AssumeRoleWithWebIdentity, and only one
    # that may be an EKS cluster's OIDC provider takes a service account's token: a role trusting
    # only GitHub Actions or Cognito is a web identity role but not IRSA.
    if isinstance(principal, Mapping):
        named = {str(p) for values in principal.values() for p in _as_list(values)}
        federated = [str(p) for p in _as_list(principal.get("Federated"))]
        if "*" not in named and all(_other_identity_provider(p) for p in federated):
            return False
    if "NotAction" in statement:
        return not _matches_any(_as_list(statement.get("NotAction")), WEB_IDENTITY_ASSUME)
    return _matches_any(_as_list(statement.get("Action")), WEB_IDENTITY_ASSUME)


def check_irsa_trust_scoped(resource_type: str, props: Props) -> list[str]:
    """An IRSA role trusts exactly one service account (``:sub`` by StringEquals, no wildcard)."""
    if resource_type != ROLE:
        return []
    document = _document(props.get("assumeRolePolicy"))
    if document is None:
        return []
    messages = []
    trusted: set[str] = set()
    for statement in _statements(document):
        if not _may_grant_web_identity(statement):
            continue
        equals = (statement.get("Condition") or {}).get("StringEquals") or {}
        subjects = [
            str(v)
            for key, value in equals.items()
            if str(key).lower().endswith(":sub")
            for v in _as_list(value)
        ]
        trusted.update(subjects)
        if not subjects or any(
            _has_wildcard(s) or not s.startswith("system:serviceaccount:") for s in subjects
        ):
            messages.append(
                "IRSA trust policy must pin '<issuer>:sub' with StringEquals to "
                "'system:serviceaccount:<namespace>:<name>' (no wildcards)"
            )
    if len(trusted) > 1:
        messages.append(
            f"IRSA trust policy trusts {len(trusted)} service accounts {sorted(trusted)}; "
            "trust exactly one (one role per service account)"
        )
    return messages


def _object_arn_scoped(arn: str) -> bool:
    if not arn.startswith("arn:aws:s3:::"):
        return False
    bucket_and_key = arn[len("arn:aws:s3:::") :]
    if "/" not in bucket_and_key:
        return False
    bucket, key = bucket_and_key.split("/", 1)
    prefix = re.split(r"[*?]", key, maxsplit=1)[0]
    return not _has_wildcard(bucket) and prefix.rstrip("/") != "" and prefix.endswith("/")


def _literal_key_prefix(value: Any) -> bool:
    prefix = str(value)
    if prefix.endswith("/*"):
        prefix = prefix[:-1]
    return prefix.endswith("/") and prefix.rstrip("/") != "" and not _has_wildcard(prefix)


def _listing_scoped(statement: Mapping[str, Any]) -> bool:
    prefixes = [
        value
        for operator, condition in (statement.get("Condition") or {}).items()
        if operator in PREFIX_SCOPING_OPERATORS and isinstance(condition, Mapping)
        for key, values in condition.items()
        if str(key).lower() == "s3:prefix"
        for value in _as_list(values)
    ]
    return bool(prefixes) and all(_literal_key_prefix(p) for p in prefixes)


def _names_s3(action: str) -> bool:
    head = re.split(r"[*?]", action.lower(), maxsplit=1)[0]
    return head.startswith("s3:") or (_has_wildcard(action) and "s3:".startswith(head))


def _may_name_s3(resource: str) -> bool:
    # Once an ARN spells out its service (arn:partition:service:...), only s3 can be S3: a KMS key
    # granted beside the objects it decrypts is no S3 access. A wildcard before that may be S3.
    parts = re.split(r"[*?]", resource, maxsplit=1)[0].split(":")
    return len(parts) < 4 or parts[2].lower() == "s3"


def _policy_documents(resource_type: str, props: Props) -> list[Mapping[str, Any]]:
    if resource_type in POLICY_DOCUMENT_TYPES:
        values = [props.get("policy")]
    elif resource_type == ROLE:
        values = [
            inline.get("policy")
            for inline in _as_list(props.get("inlinePolicies"))
            if isinstance(inline, Mapping)
        ]
    else:
        return []
    return [d for d in (_document(v) for v in values) if d is not None]


def _unscoped(actions: str, resources: str) -> str:
    return (
        f"S3 access {actions} on {resources} is not scoped to a key prefix; use "
        "'arn:aws:s3:::<bucket>/models/<model_id>/*' (and s3:ListBucket with an s3:prefix "
        "condition naming that prefix)"
    )


def _statement_problems(statement: Mapping[str, Any]) -> list[str]:
    if statement.get("Effect") != "Allow":
        return []
    if "NotAction" in statement:
        # Every action but the listed ones: S3 is granted unless all of it is excluded.
        excluded = [str(a) for a in _as_list(statement.get("NotAction"))]
        if _matches_any(excluded, "s3:*"):
            return []
        shown, actions = f"every action but {excluded}", {"s3:*"}
    else:
        listed = [str(a) for a in _as_list(statement.get("Action"))]
        if not any(_names_s3(a) for a in listed):
            return []
        shown, actions = str(listed), {a.lower() for a in listed}
    if "NotResource" in statement:
        others = [str(r) for r in _as_list(statement.get("NotResource"))]
        return [_unscoped(shown, f"every resource but {others}")]
    problems = []
    for resource in (str(r) for r in _as_list(statement.get("Resource"))):
        if not _may_name_s3(resource) or _object_arn_scoped(resource):
            continue
        bucket = resource.removeprefix("arn:aws:s3:::")
        bucket_only = resource != bucket and "/" not in bucket and not _has_wildcard(bucket)
        # Configuration reads need no prefix, so only the rest (a ListBucket, say) is scoped.
        remaining = actions - {a.lower() for a in BUCKET_CONFIGURATION_READS}
        if bucket_only and (
            not remaining or (remaining == {"s3:listbucket"} and _listing_scoped(statement))
        ):
            continue
        problems.append(_unscoped(shown, repr(resource)))
    return problems


def check_s3_access_scoped_to_prefix(resource_type: str, props: Props) -> list[str]:
    """S3 permissions name object ARNs under a key prefix; ListBucket needs a literal s3:prefix.

    Policies and role policies are checked, and so are a role's inline policies.
    """
    return [
        problem
        for document in _policy_documents(resource_type, props)
        for statement in _statements(document)
        for problem in _statement_problems(statement)
    ]
