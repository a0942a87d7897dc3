"""CpuNodeGroup: standard AMI, its own taint and labels (CPU model pods only), IMDSv2, the model
cache clients' security group; not a GPU group to the policy pack."""

from __future__ import annotations

import pytest

from components.cpu_node_group import (
    CPU_MODELS_ROLE,
    CPU_MODELS_TAINT,
    CpuNodeGroup,
    CpuNodeGroupArgs,
    cpu_tolerations,
)
from contracts.labels import GPU_RESOURCE, NODE_GROUP_LABEL, NODE_ROLE_LABEL
from policy.aws import check_gpu_node_group_tainted, check_imdsv2_required
from tests.components.declared import Declare

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"


def _args(**overrides: object) -> CpuNodeGroupArgs:
    values: dict[str, object] = {
        "cluster_name": "c",
        "subnet_ids": ["subnet-1", "subnet-2"],
        "security_group_ids": ["sg-cluster", "sg-nodes"],
        "instance_types": ["c7i.2xlarge"],
        "min_size": 1,
        "max_size": 4,
        "desired_size": 2,
    }
    values.update(overrides)
    return CpuNodeGroupArgs(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ami_type", "root_device"),
    [("AL2023_x86_64_STANDARD", "/dev/xvda"), ("BOTTLEROCKET_x86_64", "/dev/xvdb")],
)
def test_cpu_nodes_are_tainted_for_cpu_models_and_hardened(
    declare: Declare, ami_type: str, root_device: str
) -> None:
    made: list[CpuNodeGroup] = []
    declared = declare(lambda: made.append(CpuNodeGroup("r-cpu", _args(ami_type=ami_type))))
    group = declared.one(NODE_GROUP).inputs
    assert group["amiType"] == ami_type
    assert group["instanceTypes"] == ["c7i.2xlarge"]
    assert group["taints"] == [{"key": CPU_MODELS_TAINT, "effect": "NO_SCHEDULE"}]
    assert group["labels"] == {NODE_GROUP_LABEL: "r-cpu", NODE_ROLE_LABEL: CPU_MODELS_ROLE}
    assert made[0].labels == group["labels"]
    # The pods' toleration is for exactly this taint, and it is not the GPU one.
    (toleration,) = cpu_tolerations()
    assert toleration["key"] == CPU_MODELS_TAINT != GPU_RESOURCE
    assert (toleration["operator"], toleration["effect"]) == ("Exists", "NoSchedule")
    # Not a GPU group by the policy pack's evidence: its taint is not required.
    assert check_gpu_node_group_tainted(NODE_GROUP, group) == []
    template = declared.one(LAUNCH_TEMPLATE).inputs
    assert check_imdsv2_required(LAUNCH_TEMPLATE, template) == []
    assert template["vpcSecurityGroupIds"] == ["sg-cluster", "sg-nodes"]
    (volume,) = template["blockDeviceMappings"]
    assert volume["deviceName"] == root_device
    assert (volume["ebs"]["volumeSize"], volume["ebs"]["encrypted"]) == (100, "true")
    assert "userData" not in template


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"ami_type": "AL2023_x86_64_NVIDIA"},
            "expected one of: AL2023_x86_64_STANDARD, BOTTLEROCKET_x86_64",
        ),
        ({"capacity_type": "CAPACITY_BLOCK"}, "expected one of: ON_DEMAND, SPOT"),
        ({"instance_types": []}, "at least one CPU instance type"),
        ({"desired_size": 9}, "min_size <= desired_size <= max_size"),
    ],
)
def test_bad_args_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CpuNodeGroup("bad", _args(**overrides))
