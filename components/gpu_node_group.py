"""``GpuNodeGroup``: an EKS managed node group of NVIDIA GPU instances, tainted for GPU pods."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import pulumi
import pulumi_aws as aws

from components.iam import node_role
from components.node_launch import (
    NODE_GROUP_NAME_LIMIT,
    encrypted_root_volume,
    imdsv2_only,
    managed_node_group,
)
from contracts.labels import AMI_FAMILY_LABEL, GPU_RESOURCE, NODE_GROUP_LABEL

__all__ = [
    "AMI_FAMILY_LABEL",
    "AMI_TYPES",
    "CAPACITY_TYPES",
    "DEVICE_PLUGIN_NODES",
    "GPU_RESOURCE",
    "NODE_GROUP_LABEL",
    "NODE_GROUP_NAME_LIMIT",
    "GpuNodeGroup",
    "GpuNodeGroupArgs",
    "gpu_tolerations",
    "node_selector",
]

# Nodes whose AMI needs the NVIDIA device plugin as a DaemonSet (AL2023; Bottlerocket has it).
DEVICE_PLUGIN_NODES: Mapping[str, str] = MappingProxyType({AMI_FAMILY_LABEL: "al2023"})
AMI_TYPES = ("AL2023_x86_64_NVIDIA", "BOTTLEROCKET_x86_64_NVIDIA")
CAPACITY_TYPES = ("ON_DEMAND", "SPOT", "CAPACITY_BLOCK")
# AL2023's nodeadm stripes the instance-store NVMe disks into one RAID0 volume and moves the
# kubelet and containerd directories onto it, so unpacked model packages (emptyDir) land there.
_AL2023_USER_DATA = """MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="LLMSERVING"

--LLMSERVING
Content-Type: application/node.eks.aws

---
apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  instance:
    localStorage:
      strategy: RAID0

--LLMSERVING--
"""
# Bottlerocket does the same through its ephemeral-storage API at every boot.
_BOTTLEROCKET_USER_DATA = """[settings.bootstrap-commands.k8s-ephemeral-storage]
commands = [["apiclient", "ephemeral-storage", "init"], \
["apiclient", "ephemeral-storage", "bind", "--dirs", "/var/lib/containerd", "/var/lib/kubelet", \
"/var/log/pods"]]
mode = "always"
essential = true
"""


def gpu_tolerations() -> list[dict[str, str]]:
    """The toleration GPU pods need for the node group's ``nvidia.com/gpu`` NoSchedule taint."""
    return [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]


def node_selector(group: str) -> dict[str, str]:
    """The node selector that pins a pod onto one node group (GPU, or ``CpuNodeGroup``'s)."""
    return {NODE_GROUP_LABEL: group}


@dataclass(frozen=True)
class GpuNodeGroupArgs:
    """Inputs of a GPU node group."""

    cluster_name: pulumi.Input[str]
    """Name of the EKS cluster the group joins."""
    subnet_ids: Sequence[pulumi.Input[str]]
    """Private subnets the nodes are launched in."""
    security_group_ids: Sequence[pulumi.Input[str]]
    """Security groups of the nodes (the cluster's and the GPU nodes' own)."""
    instance_types: Sequence[str]
    """GPU instance types, e.g. ``p5.48xlarge``."""
    min_size: int
    """Lower scaling bound."""
    max_size: int
    """Upper scaling bound."""
    desired_size: int
    """Node count, set on every update: no autoscaler resizes the group."""
    gpus_per_node: int
    """GPUs of each instance, used to size pods."""
    ami_type: str = "AL2023_x86_64_NVIDIA"
    """One of :data:`AMI_TYPES`."""
    capacity_type: str = "ON_DEMAND"
    """One of :data:`CAPACITY_TYPES`."""
    root_volume_gib: int = 200
    """Encrypted gp3 root volume size (images and logs; packages go to local NVMe)."""
    capacity_reservation_id: str | None = None
    """The EC2 Capacity Block (``cr-...``) a ``CAPACITY_BLOCK`` group launches into."""
    kubernetes_version: pulumi.Input[str] | None = None
    """Kubernetes version of the nodes: pass the cluster's, so that they upgrade after it.
    ``None``: the cluster's version when the group is created, never upgraded after."""
    release_version: str | None = None
    """EKS AMI release of ``ami_type`` (``1.33.0-20250704`` Amazon Linux, ``1.34.0-18d04e52``
    Bottlerocket), rolled in place when it changes. ``None``: the newest release whenever the
    group is created or its Kubernetes version changes, never rolled otherwise."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra node labels."""


class GpuNodeGroup(pulumi.ComponentResource):
    """A managed node group on an NVIDIA AMI, with IMDSv2 and local NVMe for packages."""

    node_group_name: pulumi.Output[str]
    labels: dict[str, str]
    needs_device_plugin: bool

    def __init__(
        self, name: str, args: GpuNodeGroupArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        _validate(args)
        super().__init__("llm-serving:gpu_node_group:GpuNodeGroup", name, None, opts)
        family = "al2023" if args.ami_type.startswith("AL2023") else "bottlerocket"
        # Bottlerocket's NVIDIA variants run the device plugin on the host; AL2023's do not.
        self.needs_device_plugin = family == "al2023"
        self.labels = {
            **args.labels,
            NODE_GROUP_LABEL: name,
            AMI_FAMILY_LABEL: family,
            "nvidia.com/gpu.present": "true",
        }
        role = node_role(name, self)
        template = self._create_launch_template(name, args, family)
        group = managed_node_group(
            name,
            args,
            role,
            template,
            ami_type=args.ami_type,
            capacity_type=args.capacity_type,
            labels=self.labels,
            parent=self,
            taints=[aws.eks.NodeGroupTaintArgs(key=GPU_RESOURCE, effect="NO_SCHEDULE")],
        )
        self.node_group_name = group.node_group_name
        self.register_outputs({"node_group_name": self.node_group_name, "labels": self.labels})

    def _create_launch_template(
        self, name: str, args: GpuNodeGroupArgs, family: str
    ) -> aws.ec2.LaunchTemplate:
        user_data = _AL2023_USER_DATA if family == "al2023" else _BOTTLEROCKET_USER_DATA
        root_device = "/dev/xvda" if family == "al2023" else "/dev/xvdb"
        return aws.ec2.LaunchTemplate(
            f"{name}-launch-template",
            metadata_options=imdsv2_only(),
            block_device_mappings=encrypted_root_volume(root_device, args.root_volume_gib),
            vpc_security_group_ids=list(args.security_group_ids),
            **_capacity_block(args),
            user_data=base64.b64encode(user_data.encode()).decode(),
            update_default_version=True,
            opts=pulumi.ResourceOptions(parent=self),
        )


def _capacity_block(args: GpuNodeGroupArgs) -> dict[str, object]:
    """Launch-template settings that place a ``CAPACITY_BLOCK`` group in its reservation."""
    if args.capacity_reservation_id is None:
        return {}
    return {
        "instance_market_options": aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(
            market_type="capacity-block"
        ),
        "capacity_reservation_specification": (
            aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
                capacity_reservation_target=(
                    aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                        capacity_reservation_id=args.capacity_reservation_id
                    )
                )
            )
        ),
    }


def _validate(args: GpuNodeGroupArgs) -> None:
    if args.ami_type not in AMI_TYPES:
        raise ValueError(
            f"unsupported ami_type {args.ami_type!r}; expected one of: {', '.join(AMI_TYPES)}"
        )
    if args.capacity_type not in CAPACITY_TYPES:
        raise ValueError(
            f"unsupported capacity_type {args.capacity_type!r}; "
            f"expected one of: {', '.join(CAPACITY_TYPES)}"
        )
    if (args.capacity_type == "CAPACITY_BLOCK") != (args.capacity_reservation_id is not None):
        raise ValueError(
            "capacity_reservation_id is required with capacity_type CAPACITY_BLOCK, and only there"
        )
    if args.capacity_reservation_id is not None and len(args.subnet_ids) != 1:
        raise ValueError(
            f"subnet_ids has {len(args.subnet_ids)} subnets; a Capacity Block lives in one "
            "Availability Zone, so pass only the subnet in its zone"
        )
    if not args.instance_types:
        raise ValueError("instance_types must name at least one GPU instance type")
    if not args.min_size <= args.desired_size <= args.max_size:
        raise ValueError(
            f"expected min_size <= desired_size <= max_size, got "
            f"{args.min_size} <= {args.desired_size} <= {args.max_size}"
        )
