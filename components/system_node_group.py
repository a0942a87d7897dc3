"""``SystemNodeGroup``: the untainted CPU node group of a created cluster.

Every GPU node carries the ``nvidia.com/gpu`` NoSchedule taint, so a created cluster needs
these nodes for CoreDNS, the add-on controllers and the rollout-status Jobs. An adopted cluster
brings its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.iam import node_role
from components.node_launch import encrypted_root_volume, imdsv2_only, managed_node_group
from contracts.labels import NODE_ROLE_LABEL

__all__ = [
    "AMI_TYPE",
    "NODE_ROLE_LABEL",
    "SYSTEM_NODE_LABELS",
    "SystemNodeGroup",
    "SystemNodeGroupArgs",
]

AMI_TYPE = "AL2023_x86_64_STANDARD"
SYSTEM_NODE_LABELS = {NODE_ROLE_LABEL: "system"}


@dataclass(frozen=True)
class SystemNodeGroupArgs:
    """Inputs of the system node group (``llm-serving:cluster.system_nodes``)."""

    cluster_name: pulumi.Input[str]
    """Name of the EKS cluster the group joins."""
    subnet_ids: Sequence[pulumi.Input[str]]
    """Private subnets the nodes are launched in."""
    instance_types: Sequence[str]
    """CPU instance types, e.g. ``m6i.xlarge``."""
    min_size: int
    """Lower scaling bound."""
    max_size: int
    """Upper scaling bound."""
    desired_size: int
    """Node count, set on every update: no autoscaler resizes the group."""
    root_volume_gib: int = 50
    """Encrypted gp3 root volume size (images, logs, the add-ons' emptyDir volumes)."""
    kubernetes_version: pulumi.Input[str] | None = None
    """Kubernetes version of the nodes: pass the cluster's, so that they upgrade after it.
    ``None``: the cluster's version when the group is created, never upgraded after."""
    release_version: str | None = None
    """EKS AMI release of :data:`AMI_TYPE` (``1.33.0-20250704``), rolled in place when it
    changes. ``None``: the newest release whenever the group is created or its Kubernetes
    version changes, never rolled otherwise."""


class SystemNodeGroup(pulumi.ComponentResource):
    """A managed node group on the standard AL2023 AMI, untainted, with IMDSv2."""

    node_group_name: pulumi.Output[str]
    labels: dict[str, str]

    def __init__(
        self, name: str, args: SystemNodeGroupArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        _validate(args)
        super().__init__("llm-serving:system_node_group:SystemNodeGroup", name, None, opts)
        self.labels = dict(SYSTEM_NODE_LABELS)
        role = node_role(name, self)
        template = self._create_launch_template(name, args)
        group = managed_node_group(
            name,
            args,
            role,
            template,
            ami_type=AMI_TYPE,
            capacity_type="ON_DEMAND",
            labels=self.labels,
            parent=self,
        )
        self.node_group_name = group.node_group_name
        self.register_outputs({"node_group_name": self.node_group_name, "labels": self.labels})

    def _create_launch_template(
        self, name: str, args: SystemNodeGroupArgs
    ) -> aws.ec2.LaunchTemplate:
        # No security groups here: EKS then gives the nodes the cluster security group.
        return aws.ec2.LaunchTemplate(
            f"{name}-launch-template",
            metadata_options=imdsv2_only(),
            block_device_mappings=encrypted_root_volume("/dev/xvda", args.root_volume_gib),
            update_default_version=True,
            opts=pulumi.ResourceOptions(parent=self),
        )


def _validate(args: SystemNodeGroupArgs) -> None:
    if not args.instance_types:
        raise ValueError("instance_types must name at least one instance type")
    if not 1 <= args.min_size <= args.desired_size <= args.max_size:
        raise ValueError(
            f"expected 1 <= min_size <= desired_size <= max_size, got "
            f"{args.min_size} <= {args.desired_size} <= {args.max_size}"
        )
