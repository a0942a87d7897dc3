"""IAM roles of the components: trust policies, bounded role names, the EKS node role."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from contracts.naming import physical_name

__all__ = [
    "ROLE_NAME_LIMIT",
    "NodeRole",
    "irsa_trust_policy",
    "node_role",
    "role_name",
    "service_trust_policy",
]

ROLE_NAME_LIMIT = 64
_NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
)


def service_trust_policy(service: str, actions: Sequence[str] = ("sts:AssumeRole",)) -> str:
    """The assume-role policy document (JSON) trusting ``service``, e.g. ``ec2.amazonaws.com``."""
    action: str | list[str] = actions[0] if len(actions) == 1 else list(actions)
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": action}],
        }
    )


def irsa_trust_policy(
    oidc_provider_arn: pulumi.Input[str],
    oidc_issuer: pulumi.Input[str],
    namespace: str,
    service_account: str,
) -> pulumi.Output[str]:
    """The assume-role policy document (JSON) trusting exactly one Kubernetes service account
    through the cluster's OIDC provider (IRSA); ``oidc_issuer`` has no ``https://``."""
    subject = f"system:serviceaccount:{namespace}:{service_account}"
    return pulumi.Output.all(oidc_provider_arn, oidc_issuer).apply(
        lambda values: json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Principal": {"Federated": values[0]},
                        "Action": "sts:AssumeRoleWithWebIdentity",
                        "Condition": {
                            "StringEquals": {
                                f"{values[1]}:sub": subject,
                                f"{values[1]}:aud": "sts.amazonaws.com",
                            }
                        },
                    }
                ],
            }
        )
    )


def role_name(resource_name: str) -> str | None:
    """The ``name`` of an ``aws.iam.Role``: ``None`` (auto-named) where that fits IAM's 64
    characters, else the resource name bounded with a hash."""
    return physical_name(resource_name, ROLE_NAME_LIMIT)


@dataclass(frozen=True)
class NodeRole:
    """An EKS node role and its policy attachments."""

    role: aws.iam.Role
    """The role the node group's instances assume."""
    attachments: tuple[aws.iam.RolePolicyAttachment, ...]
    """The worker, CNI and ECR read policies: a node group depends on them, as its nodes
    cannot join the cluster without them and the group must be gone before they are."""


def node_role(name: str, parent: pulumi.Resource) -> NodeRole:
    """The role of an EKS managed node group's instances, with the standard worker policies."""
    role = aws.iam.Role(
        f"{name}-node-role",
        name=role_name(f"{name}-node-role"),
        assume_role_policy=service_trust_policy("ec2.amazonaws.com"),
        opts=pulumi.ResourceOptions(parent=parent),
    )
    attachments = tuple(
        aws.iam.RolePolicyAttachment(
            f"{name}-{policy.rsplit('/', 1)[1]}",
            role=role.name,
            policy_arn=policy,
            opts=pulumi.ResourceOptions(parent=role),
        )
        for policy in _NODE_POLICIES
    )
    return NodeRole(role=role, attachments=attachments)
