"""``CpuNodeGroup``: an EKS managed node group of CPU instances for models served without GPUs
(tree ensembles, small ONNX or TorchScript models on Triton's CPU backends).

Its nodes are tainted ``llm-serving/cpu-models:NoSchedule`` so that only the model pods that
tolerate it land there: add-ons and Jobs would otherwise take the capacity each model's pod was
sized against (the fit check in ``stacks/config.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from components.iam import node_role
from components.node_launch import encrypted_root_volume, imdsv2_only, managed_node_group
from contracts.labels import NODE_GROUP_LABEL, NODE_ROLE_LABEL

__all__ = [
    "AMI_TYPES",
    "CAPACITY_TYPES",
    "CPU_MODELS_ROLE",
    "CPU_MODELS_TAINT",
    "CpuNodeGroup",
    "CpuNodeGroupArgs",
    "cpu_tolerations",
]

AMI_TYPES = ("AL2023_x86_64_STANDARD", "BOTTLEROCKET_x86_64")
# No Capacity Blocks: they are sold for GPU (and Trainium) instances only.
CAPACITY_TYPES = ("ON_DEMAND", "SPOT")
CPU_MODELS_TAINT = "llm-serving/cpu-models"
"""Key of the NoSchedule taint of CPU model nodes, which CPU model pods tolerate."""
CPU_MODELS_ROLE = "cpu-models"
"""``llm-serving/node-role`` of CPU model nodes (the system nodes' is ``system``)."""


def cpu_tolerations() -> list[dict[str, str]]:
    """The toleration CPU model pods need for the group's NoSchedule taint."""
    return [{"key": CPU_MODELS_TAINT, "operator": "Exists", "effect": "NoSchedule"}]


@dataclass(frozen=True)
class CpuNodeGroupArgs:
    """Inputs of a CPU model node group."""

    cluster_name: pulumi.Input[str]
    """Name of the EKS cluster the group joins."""
    subnet_ids: Sequence[pulumi.Input[str]]
    """Private subnets the nodes are launched in."""
    security_group_ids: Sequence[pulumi.Input[str]]
    """Security groups of the nodes: the cluster's and the model cache clients' (Lustre)."""
    instance_types: Sequence[str]
    """CPU instance types, e.g. ``c7i.2xlarge``."""
    min_size: int
    """Lower scaling bound."""
    max_size: int
    """Upper scaling bound."""
    desired_size: int
    """Node count, set on every update: no autoscaler resizes the group."""
    ami_type: str = "AL2023_x86_64_STANDARD"
    """One of :data:`AMI_TYPES`."""
    capacity_type: str = "ON_DEMAND"
    """One of :data:`CAPACITY_TYPES`."""
    root_volume_gib: int = 100
    """Encrypted gp3 root volume size: without instance store, unpacked packages land here."""
    kubernetes_version: pulumi.Input[str] | None = None
    """Kubernetes version of the nodes: pass the cluster's, so that they upgrade after it.
    ``None``: the cluster's version when the group is created, never upgraded after."""
    release_version: str | None = None
    """EKS AMI release of ``ami_type`` (``1.33.0-20250704`` Amazon Linux, ``1.34.0-18d04e52``
    Bottlerocket), rolled in place when it changes. ``None``: the newest release whenever the
    group is created or its Kubernetes version changes, never rolled otherwise."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra node labels."""


class CpuNodeGroup(pulumi.ComponentResource):
    """A managed node group on a standard (non-NVIDIA) AMI, tainted for CPU model pods."""

    node_group_name: pulumi.Output[str]
    labels: dict[str, str]

    def __init__(
        self, name: str, args: CpuNodeGroupArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        _validate(args)
        super().__init__("llm-serving:cpu_node_group:CpuNodeGroup", name, None, opts)
        self.labels = {**args.labels, NODE_GROUP_LABEL: name, NODE_ROLE_LABEL: CPU_MODELS_ROLE}
        role = node_role(name, self)
        bottlerocket = args.ami_type.startswith("BOTTLEROCKET")
        template = aws.ec2.LaunchTemplate(
            f"{name}-launch-template",
            metadata_options=imdsv2_only(),
            # Bottlerocket keeps containers and emptyDir volumes on its data volume, xvdb.
            block_device_mappings=encrypted_root_volume(
                "/dev/xvdb" if bottlerocket else "/dev/xvda", args.root_volume_gib
            ),
            vpc_security_group_ids=list(args.security_group_ids),
            update_default_version=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        group = managed_node_group(
            name,
            args,
            role,
            template,
            ami_type=args.ami_type,
            capacity_type=args.capacity_type,
            labels=self.labels,
            parent=self,
            taints=[aws.eks.NodeGroupTaintArgs(key=CPU_MODELS_TAINT, effect="NO_SCHEDULE")],
        )
        self.node_group_name = group.node_group_name
        self.register_outputs({"node_group_name": self.node_group_name, "labels": self.labels})


def _validate(args: CpuNodeGroupArgs) -> None:
    if args.ami_type not in AMI_TYPES:
        raise ValueError(
            f"unsupported ami_type {args.ami_type!r}; expected one of: {', '.join(AMI_TYPES)}"
        )
    if args.capacity_type not in CAPACITY_TYPES:
        raise ValueError(
            f"unsupported capacity_type {args.capacity_type!r}; "
            f"expected one of: {', '.join(CAPACITY_TYPES)}"
        )
    if not args.instance_types:
        raise ValueError("instance_types must name at least one CPU instance type")
    if not args.min_size <= args.desired_size <= args.max_size:
        raise ValueError(
            f"expected min_size <= desired_size <= max_size, got "
            f"{args.min_size} <= {args.desired_size} <= {args.max_size}"
        )
