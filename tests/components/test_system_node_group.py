"""SystemNodeGroup: standard AL2023 CPU nodes, untainted and labelled, IMDSv2, worker role."""

from __future__ import annotations

import pytest

from components.system_node_group import (
    NODE_ROLE_LABEL,
    SystemNodeGroup,
    SystemNodeGroupArgs,
)
from policy.aws import check_gpu_node_group_tainted, check_imdsv2_required
from tests.components.declared import Declare

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"


def _args(**overrides: object) -> SystemNodeGroupArgs:
    values: dict[str, object] = {
        "cluster_name": "c",
        "subnet_ids": ["subnet-1", "subnet-2"],
        "instance_types": ["m6i.xlarge"],
        "min_size": 2,
        "max_size": 4,
        "desired_size": 3,
    }
    values.update(overrides)
    return SystemNodeGroupArgs(**values)  # type: ignore[arg-type]


def test_system_nodes_are_untainted_standard_al2023_sized_from_the_args(declare: Declare) -> None:
    declared = declare(lambda: SystemNodeGroup("r-system", _args()))
    group = declared.one(NODE_GROUP).inputs
    assert group["amiType"] == "AL2023_x86_64_STANDARD"
    assert group["capacityType"] == "ON_DEMAND"
    assert group["instanceTypes"] == ["m6i.xlarge"]
    assert group["scalingConfig"] == {"minSize": 2, "maxSize": 4, "desiredSize": 3}
    assert group["subnetIds"] == ["subnet-1", "subnet-2"]
    assert not group.get("taints")
    assert group["labels"] == {NODE_ROLE_LABEL: "system"}
    # Neither a GPU group by the policy pack's evidence, nor one that allows IMDSv1.
    assert check_gpu_node_group_tainted(NODE_GROUP, group) == []
    template = declared.one(LAUNCH_TEMPLATE)
    assert group["launchTemplate"]["id"] == f"{template.name}-id"
    assert check_imdsv2_required(LAUNCH_TEMPLATE, template.inputs) == []
    assert template.inputs["metadataOptions"]["httpPutResponseHopLimit"] == 1
    assert template.inputs["blockDeviceMappings"][0]["ebs"]["encrypted"] == "true"
    # Without security groups of its own the nodes get the cluster security group.
    assert "vpcSecurityGroupIds" not in template.inputs


def test_system_nodes_have_their_own_role_with_the_worker_policies(declare: Declare) -> None:
    declared = declare(lambda: SystemNodeGroup("r-system", _args()))
    role = declared.one("aws:iam/role:Role")
    assert role.name == "r-system-node-role"
    assert '"ec2.amazonaws.com"' in role.inputs["assumeRolePolicy"]
    assert declared.one(NODE_GROUP).inputs["nodeRoleArn"] == f"arn:aws:mock:::{role.name}"
    attachments = declared.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    assert {a.inputs["role"] for a in attachments} == {role.name}
    assert {a.inputs["policyArn"].rsplit("/", 1)[1] for a in attachments} == {
        "AmazonEKSWorkerNodePolicy",
        "AmazonEKS_CNI_Policy",
        "AmazonEC2ContainerRegistryReadOnly",
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"instance_types": []}, "instance_types"),
        ({"min_size": 0, "desired_size": 0}, "1 <= min_size"),
        ({"desired_size": 5}, "desired_size <= max_size"),
    ],
)
def test_bad_sizes_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SystemNodeGroup("r-system", _args(**overrides))
