"""The EKS cluster a region runs on: created by the stack, or an existing one adopted by name."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.iam import role_name, service_trust_policy

__all__ = ["ClusterArgs", "ClusterHandles", "adopt_cluster", "create_cluster", "kubeconfig"]


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


def create_cluster(name: str, args: ClusterArgs, parent: pulumi.Resource) -> ClusterHandles:
    """Create the EKS cluster (API authentication, control-plane logs) and its OIDC provider."""
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
            endpoint_private_access=True,
            endpoint_public_access=True,
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
