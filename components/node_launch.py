"""What every node group of the platform shares: launch-template settings and the group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import pulumi
import pulumi_aws as aws

from components.iam import NodeRole
from contracts.naming import physical_name

__all__ = [
    "NODE_GROUP_NAME_LIMIT",
    "NodeGroupPlacement",
    "encrypted_root_volume",
    "imdsv2_only",
    "managed_node_group",
]

# EKS refuses longer node group names; pulumi-aws would auto-name up to 255.
NODE_GROUP_NAME_LIMIT = 63


class NodeGroupPlacement(Protocol):
    """The arguments every node group's args carry: its cluster, subnets, types and sizes."""

    @property
    def cluster_name(self) -> pulumi.Input[str]: ...
    @property
    def subnet_ids(self) -> Sequence[pulumi.Input[str]]: ...
    @property
    def instance_types(self) -> Sequence[str]: ...
    @property
    def min_size(self) -> int: ...
    @property
    def max_size(self) -> int: ...
    @property
    def desired_size(self) -> int: ...
    @property
    def kubernetes_version(self) -> pulumi.Input[str] | None: ...
    @property
    def release_version(self) -> str | None: ...


def imdsv2_only() -> aws.ec2.LaunchTemplateMetadataOptionsArgs:
    """IMDSv2 with a hop limit of 1, which keeps pods (they use IRSA) away from the node role."""
    return aws.ec2.LaunchTemplateMetadataOptionsArgs(
        http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1
    )


def encrypted_root_volume(
    device_name: str, size_gib: int
) -> list[aws.ec2.LaunchTemplateBlockDeviceMappingArgs]:
    """An encrypted gp3 root volume of ``size_gib``, deleted with its instance."""
    return [
        aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
            device_name=device_name,
            ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                volume_size=size_gib,
                volume_type="gp3",
                encrypted="true",
                delete_on_termination="true",
            ),
        )
    ]


def managed_node_group(
    name: str,
    args: NodeGroupPlacement,
    role: NodeRole,
    template: aws.ec2.LaunchTemplate,
    *,
    ami_type: str,
    capacity_type: str,
    labels: dict[str, str],
    parent: pulumi.Resource,
    taints: Sequence[aws.eks.NodeGroupTaintArgs] | None = None,
) -> aws.eks.NodeGroup:
    """The EKS managed node group ``{name}-nodes`` launched from ``template``, one node
    replaced at a time, at the sizes of ``args`` on every update.

    ``template`` must name no AMI (``image_id``): EKS then picks the AMI of ``ami_type`` for
    ``args.kubernetes_version`` at ``args.release_version`` (``None``: the newest release), both
    of which it refuses to set for a template with a custom AMI.
    """
    return aws.eks.NodeGroup(
        f"{name}-nodes",
        node_group_name=physical_name(f"{name}-nodes", NODE_GROUP_NAME_LIMIT),
        cluster_name=args.cluster_name,
        node_role_arn=role.role.arn,
        subnet_ids=list(args.subnet_ids),
        ami_type=ami_type,
        capacity_type=capacity_type,
        instance_types=list(args.instance_types),
        version=args.kubernetes_version,
        release_version=args.release_version,
        # No cluster autoscaler or Karpenter runs on these clusters: the stack file owns the
        # size, so desired_size is not ignored (scaling to 0 drains a Capacity Block group).
        scaling_config=aws.eks.NodeGroupScalingConfigArgs(
            min_size=args.min_size, max_size=args.max_size, desired_size=args.desired_size
        ),
        update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
        labels=labels,
        taints=taints,
        launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
            id=template.id, version=template.latest_version.apply(str)
        ),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(role.attachments)),
    )
