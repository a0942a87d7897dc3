"""GpuNodeGroup: NVIDIA AMI, GPU taint and labels, IMDSv2, local NVMe, device-plugin need."""

from __future__ import annotations

import base64

import pytest

from components.gpu_node_group import (
    GPU_RESOURCE,
    NODE_GROUP_LABEL,
    GpuNodeGroup,
    GpuNodeGroupArgs,
    gpu_tolerations,
    node_selector,
)
from tests.components.declared import Declare

_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute"}


def _args(**overrides: object) -> GpuNodeGroupArgs:
    values: dict[str, object] = {
        "cluster_name": "c",
        "subnet_ids": ["subnet-1", "subnet-2"],
        "security_group_ids": ["sg-cluster", "sg-nodes"],
        "instance_types": ["g6e.12xlarge"],
        "min_size": 1,
        "max_size": 4,
        "desired_size": 2,
        "gpus_per_node": 4,
    }
    values.update(overrides)
    return GpuNodeGroupArgs(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ami_type", "marker", "plugin"),
    [
        ("AL2023_x86_64_NVIDIA", "strategy: RAID0", True),
        ("BOTTLEROCKET_x86_64_NVIDIA", '"ephemeral-storage", "bind"', False),
    ],
)
def test_node_group_is_tainted_labelled_and_hardened(
    declare: Declare, ami_type: str, marker: str, plugin: bool
) -> None:
    made: list[GpuNodeGroup] = []
    declared = declare(lambda: made.append(GpuNodeGroup("l40s", _args(ami_type=ami_type))))
    group = declared.one("aws:eks/nodeGroup:NodeGroup").inputs
    assert group["amiType"] == ami_type
    assert group["instanceTypes"] == ["g6e.12xlarge"]
    assert group["scalingConfig"] == {"minSize": 1, "maxSize": 4, "desiredSize": 2}
    assert group["taints"] == [{"key": GPU_RESOURCE, "effect": "NO_SCHEDULE"}]
    assert group["labels"][NODE_GROUP_LABEL] == "l40s"
    template = declared.one("aws:ec2/launchTemplate:LaunchTemplate")
    assert group["launchTemplate"]["id"] == f"{template.name}-id"
    assert template.inputs["metadataOptions"]["httpTokens"] == "required"
    assert template.inputs["vpcSecurityGroupIds"] == ["sg-cluster", "sg-nodes"]
    assert template.inputs["blockDeviceMappings"][0]["ebs"]["encrypted"] == "true"
    assert marker in base64.b64decode(template.inputs["userData"]).decode()
    assert made[0].needs_device_plugin is plugin
    policies = {
        r.inputs["policyArn"]
        for r in declared.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    }
    assert "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy" in policies


def test_pod_tolerations_match_the_taint(declare: Declare) -> None:
    declared = declare(lambda: GpuNodeGroup("h100", _args()))
    taints = declared.one("aws:eks/nodeGroup:NodeGroup").inputs["taints"]
    labels = declared.one("aws:eks/nodeGroup:NodeGroup").inputs["labels"]
    for taint in taints:
        assert any(
            t["key"] == taint["key"] and t["effect"] == _EFFECTS[taint["effect"]]
            for t in gpu_tolerations()
        )
    assert node_selector("h100").items() <= labels.items()


def test_capacity_block_launches_into_its_reservation(declare: Declare) -> None:
    args = _args(
        capacity_type="CAPACITY_BLOCK", capacity_reservation_id="cr-0abc", subnet_ids=["subnet-1"]
    )
    declared = declare(lambda: GpuNodeGroup("h100", args))
    template = declared.one("aws:ec2/launchTemplate:LaunchTemplate").inputs
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    target = template["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target == {"capacityReservationId": "cr-0abc"}
    nodes = declared.one("aws:eks/nodeGroup:NodeGroup").inputs
    assert nodes["capacityType"] == "CAPACITY_BLOCK"
    assert nodes["subnetIds"] == ["subnet-1"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ami_type": "AL2_x86_64_GPU"}, "expected one of: AL2023_x86_64_NVIDIA, BOTTLEROCKET"),
        ({"capacity_type": "RESERVED"}, "expected one of: ON_DEMAND, SPOT, CAPACITY_BLOCK"),
        ({"desired_size": 9}, "min_size <= desired_size <= max_size"),
        ({"instance_types": []}, "at least one GPU instance type"),
        ({"capacity_type": "CAPACITY_BLOCK"}, "capacity_reservation_id is required"),
        ({"capacity_reservation_id": "cr-1"}, "capacity_reservation_id is required"),
        (
            {"capacity_type": "CAPACITY_BLOCK", "capacity_reservation_id": "cr-1"},
            "a Capacity Block lives in one Availability Zone",
        ),
    ],
)
def test_bad_args_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GpuNodeGroup("bad", _args(**overrides))
