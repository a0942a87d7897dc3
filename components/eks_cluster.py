"""The EKS cluster a region runs on: created by the stack, or an existing one adopted by name."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.iam import irsa_trust_policy, role_name, service_trust_policy

__all__ = [
    "EBS_CSI_ADDON",
    "EBS_CSI_POLICY",
    "EBS_CSI_SERVICE_ACCOUNT",
    "PUBLIC_ACCESS_CIDRS_LIMIT",
    "ClusterArgs",
    "ClusterHandles",
    "adopt_cluster",
    "check_public_access_cidr",
    "check_public_access_cidrs",
    "create_cluster",
    "create_ebs_csi_driver",
    "kubeconfig",
]

# EKS takes at most 40 ranges for a cluster's public endpoint (a fixed service quota).
PUBLIC_ACCESS_CIDRS_LIMIT = 40
_ANYWHERE = ipaddress.IPv4Network("0.0.0.0/0")
# The EKS managed add-on's name, the service account its controller runs as and the AWS managed
# policy that account needs (EKS user guide, "Amazon EBS CSI driver").
EBS_CSI_ADDON = "aws-ebs-csi-driver"
EBS_CSI_SERVICE_ACCOUNT = ("kube-system", "ebs-csi-controller-sa")
EBS_CSI_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"


@dataclass(frozen=True)
class ClusterHandles:
    """What the platform needs from a cluster, created or adopted."""

    name: pulumi.Output[str]
    version: pulumi.Output[str]
    """The control plane's Kubernetes version: node groups take it, so that they upgrade once
    the control plane has (an output of the created cluster, the lookup of an adopted one)."""
    endpoint: pulumi.Output[str]
    certificate_authority: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    oidc_issuer: pulumi.Output[str]
    oidc_provider_arn: pulumi.Output[str]


@dataclass(frozen=True)
class ClusterArgs:
    """A cluster the stack creates."""

    name: str
    """EKS cluster name."""
    version: str
    """Kubernetes version (``1.33``)."""
    subnet_ids: Sequence[str]
    """Private subnets of the control plane's network interfaces."""
    public_access_cidrs: Sequence[str]
    """IPv4 ranges admitted to the public API endpoint; empty: no public endpoint, the API is
    reached through the private one, from inside the VPC."""


def check_public_access_cidr(value: str) -> str:
    """``value`` if EKS takes it for a public endpoint: a public IPv4 range in CIDR notation
    without host bits; else ``ValueError`` saying what to write."""
    try:
        network = ipaddress.IPv4Network(value)
    except (ipaddress.AddressValueError, ipaddress.NetmaskValueError):
        raise ValueError(
            f"{value!r} is not an IPv4 range a.b.c.d/prefix (EKS takes no IPv6 range for an "
            "IPv4 cluster)"
        ) from None
    except ValueError:
        address = value.partition("/")[0]
        wider = ipaddress.IPv4Network(value, strict=False)
        raise ValueError(
            f"{value} has host bits set; write {wider} for the range or {address}/32 for the "
            "one address"
        ) from None
    if "/" not in value:
        raise ValueError(f"{value} is an address; write {value}/32")
    if network != _ANYWHERE and not network.is_global:
        raise ValueError(
            f"{value} is a private or reserved range, which EKS refuses: requests reach the "
            "public endpoint from public addresses (a VPC's through its NAT gateways); inside "
            "the VPC the private endpoint answers"
        )
    return value


def check_public_access_cidrs(values: Sequence[str]) -> None:
    """Each range passes :func:`check_public_access_cidr`, none twice, at most
    :data:`PUBLIC_ACCESS_CIDRS_LIMIT`, and ``0.0.0.0/0`` only alone; else ``ValueError``."""
    for value in values:
        check_public_access_cidr(value)
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)} listed twice")
    if len(values) > PUBLIC_ACCESS_CIDRS_LIMIT:
        raise ValueError(
            f"{len(values)} ranges; EKS admits at most {PUBLIC_ACCESS_CIDRS_LIMIT} to a "
            "cluster's public endpoint"
        )
    if str(_ANYWHERE) in values and len(values) > 1:
        raise ValueError(
            f"{_ANYWHERE} admits every address, so the other ranges restrict nothing; list "
            f"{_ANYWHERE} alone or only the ranges to admit"
        )


def create_cluster(name: str, args: ClusterArgs, parent: pulumi.Resource) -> ClusterHandles:
    """Create the EKS cluster (API authentication, control-plane logs) and its OIDC provider."""
    check_public_access_cidrs(args.public_access_cidrs)
    role = aws.iam.Role(
        f"{name}-cluster-role",
        name=role_name(f"{name}-cluster-role"),
        assume_role_policy=service_trust_policy(
            "eks.amazonaws.com", ("sts:AssumeRole", "sts:TagSession")
        ),
        opts=pulumi.ResourceOptions(parent=parent),
    )
    attachment = aws.iam.RolePolicyAttachment(
        f"{name}-cluster-policy",
        role=role.name,
        policy_arn="arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",
        opts=pulumi.ResourceOptions(parent=role),
    )
    cluster = aws.eks.Cluster(
        f"{name}-cluster",
        name=args.name,
        version=args.version,
        role_arn=role.arn,
        vpc_config=aws.eks.ClusterVpcConfigArgs(
            subnet_ids=list(args.subnet_ids),
            # Nodes reach the API through the private endpoint, so narrowing the public one
            # never cuts them off.
            endpoint_private_access=True,
            endpoint_public_access=bool(args.public_access_cidrs),
            # Unset, EKS would admit 0.0.0.0/0.
            public_access_cidrs=list(args.public_access_cidrs) or None,
        ),
        access_config=aws.eks.ClusterAccessConfigArgs(
            authentication_mode="API", bootstrap_cluster_creator_admin_permissions=True
        ),
        enabled_cluster_log_types=["api", "audit", "authenticator"],
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[attachment]),
    )
    issuer_url = cluster.identities.apply(lambda ids: ids[0].oidcs[0].issuer)
    provider = aws.iam.OpenIdConnectProvider(
        f"{name}-oidc",
        url=issuer_url,
        client_id_lists=["sts.amazonaws.com"],
        opts=pulumi.ResourceOptions(parent=cluster),
    )
    return ClusterHandles(
        name=cluster.name,
        version=cluster.version,
        endpoint=cluster.endpoint,
        certificate_authority=cluster.certificate_authority.apply(lambda ca: ca.data),
        security_group_id=cluster.vpc_config.apply(lambda v: v.cluster_security_group_id),
        oidc_issuer=issuer_url.apply(_strip_scheme),
        oidc_provider_arn=provider.arn,
    )


def adopt_cluster(cluster_name: str, parent: pulumi.Resource) -> ClusterHandles:
    """Look up an existing cluster by name, and the IAM OIDC provider of its issuer."""
    found = aws.eks.get_cluster_output(
        name=cluster_name, opts=pulumi.InvokeOutputOptions(parent=parent)
    )
    issuer_url = found.identities.apply(lambda ids: ids[0].oidcs[0].issuer)
    provider = aws.iam.get_open_id_connect_provider_output(
        url=issuer_url, opts=pulumi.InvokeOutputOptions(parent=parent)
    )
    return ClusterHandles(
        name=found.name,
        version=found.version,
        endpoint=found.endpoint,
        certificate_authority=found.certificate_authorities.apply(lambda cas: cas[0].data),
        security_group_id=found.vpc_config.apply(lambda v: v.cluster_security_group_id),
        oidc_issuer=issuer_url.apply(_strip_scheme),
        oidc_provider_arn=provider.arn,
    )


def create_ebs_csi_driver(
    name: str, cluster: ClusterHandles, nodes: Sequence[pulumi.Resource], parent: pulumi.Resource
) -> aws.eks.Addon:
    """The EBS CSI driver as the EKS managed add-on, its controller on an IRSA role with
    ``AmazonEBSCSIDriverPolicy``; created after ``nodes``, where its pods run."""
    namespace, account = EBS_CSI_SERVICE_ACCOUNT
    role = aws.iam.Role(
        f"{name}-ebs-csi-role",
        name=role_name(f"{name}-ebs-csi-role"),
        assume_role_policy=irsa_trust_policy(
            cluster.oidc_provider_arn, cluster.oidc_issuer, namespace, account
        ),
        opts=pulumi.ResourceOptions(parent=parent),
    )
    attachment = aws.iam.RolePolicyAttachment(
        f"{name}-ebs-csi-policy",
        role=role.name,
        policy_arn=EBS_CSI_POLICY,
        opts=pulumi.ResourceOptions(parent=role),
    )
    # No addon_version, like an unpinned AMI release: EKS installs the default version for the
    # cluster's Kubernetes version when the add-on is created and never moves it on its own.
    # EKS waits for the controller's pods before it reports the add-on active.
    return aws.eks.Addon(
        f"{name}-ebs-csi",
        cluster_name=cluster.name,
        addon_name=EBS_CSI_ADDON,
        service_account_role_arn=role.arn,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[attachment, *nodes]),
    )


def _strip_scheme(url: str) -> str:
    return url.removeprefix("https://")


def kubeconfig(cluster: ClusterHandles, region: str) -> pulumi.Output[str]:
    """A kubeconfig that authenticates with ``aws eks get-token`` (no stored credentials)."""
    return pulumi.Output.all(cluster.name, cluster.endpoint, cluster.certificate_authority).apply(
        lambda values: json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": values[0],
                        "cluster": {
                            "server": values[1],
                            "certificate-authority-data": values[2],
                        },
                    }
                ],
                "contexts": [{"name": values[0], "context": {"cluster": values[0], "user": "aws"}}],
                "current-context": values[0],
                "users": [
                    {
                        "name": "aws",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1beta1",
                                "command": "aws",
                                "args": [
                                    "eks",
                                    "get-token",
                                    "--cluster-name",
                                    values[0],
                                    "--region",
                                    region,
                                ],
                            }
                        },
                    }
                ],
            }
        )
    )
