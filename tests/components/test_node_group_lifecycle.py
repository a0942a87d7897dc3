"""Every node group kind over its lifetime: the stack file's sizes reach EKS on every update,
the group waits for its role's policies, and it runs the Kubernetes version it is given."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from components.cpu_node_group import CpuNodeGroup, CpuNodeGroupArgs
from components.gpu_node_group import GpuNodeGroup, GpuNodeGroupArgs
from components.system_node_group import SystemNodeGroup, SystemNodeGroupArgs
from stacks.mock_engine import RecordedResource
from tests.components.declared import Declare, Declared

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
WORKER_POLICIES = {
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
}


def _gpu(**overrides: Any) -> None:
    GpuNodeGroup(
        "r-h100",
        GpuNodeGroupArgs(
            cluster_name="c",
            subnet_ids=["subnet-1"],
            security_group_ids=["sg-1"],
            instance_types=["p5.48xlarge"],
            gpus_per_node=8,
            capacity_type="CAPACITY_BLOCK",
            capacity_reservation_id="cr-0abc",
            **{"min_size": 2, "max_size": 8, "desired_size": 2, **overrides},
        ),
    )


def _cpu(**overrides: Any) -> None:
    CpuNodeGroup(
        "r-cpu",
        CpuNodeGroupArgs(
            cluster_name="c",
            subnet_ids=["subnet-1", "subnet-2"],
            security_group_ids=["sg-1"],
            instance_types=["c7i.2xlarge"],
            **{"min_size": 1, "max_size": 4, "desired_size": 2, **overrides},
        ),
    )


def _system(**overrides: Any) -> None:
    SystemNodeGroup(
        "r-system",
        SystemNodeGroupArgs(
            cluster_name="c",
            subnet_ids=["subnet-1", "subnet-2"],
            instance_types=["m6i.xlarge"],
            **{"min_size": 2, "max_size": 4, "desired_size": 2, **overrides},
        ),
    )


KINDS: dict[str, Callable[..., None]] = {"gpu": _gpu, "cpu": _cpu, "system": _system}


def _sent_on_update(old: RecordedResource, new: RecordedResource) -> dict[str, Any]:
    """The inputs the engine hands the provider when ``old`` is updated to ``new``: each path
    of ``ignoreChanges`` keeps its value from the old state (Pulumi's ignore_changes)."""
    sent = copy.deepcopy(new.inputs)
    for path in new.options.get("ignoreChanges", []):
        *parents, leaf = path.split(".")
        source, target = old.inputs, sent
        for key in parents:
            source, target = source[key], target[key]
        target[leaf] = source[leaf]
    return sent


@pytest.mark.parametrize("kind", KINDS)
def test_every_update_applies_the_stack_files_sizes(declare: Declare, kind: str) -> None:
    # No cluster autoscaler or Karpenter owns the size: docs/stacks.md's Capacity Block
    # upgrade drains a group with min and desired 0, and a larger min_size needs a larger
    # desired_size (EKS refuses min > desired).
    program = KINDS[kind]
    old = declare(program).one(NODE_GROUP)
    floor = 1 if kind == "system" else 0
    for sizes in (
        {"min_size": floor, "desired_size": floor},
        {"min_size": 4, "desired_size": 4, "max_size": 8},
    ):
        new = declare(lambda sizes=sizes: program(**sizes)).one(NODE_GROUP)
        scaling = _sent_on_update(old, new)["scalingConfig"]
        assert (scaling["minSize"], scaling["desiredSize"]) == (
            sizes["min_size"],
            sizes["desired_size"],
        )


@pytest.mark.parametrize("kind", KINDS)
def test_the_group_waits_for_its_roles_policies(declare: Declare, kind: str) -> None:
    # Created after them (nodes cannot join without them), deleted before them (EKS cannot
    # clean up the instances once they are detached).
    declared = declare(KINDS[kind])
    group = declared.one(NODE_GROUP)
    role = declared.one("aws:iam/role:Role")
    assert group.inputs["nodeRoleArn"] == f"arn:aws:mock:::{role.name}"
    attachments = [a for a in declared.of_type(ATTACHMENT) if a.inputs["role"] == role.name]
    assert {a.inputs["policyArn"] for a in attachments} == WORKER_POLICIES
    missing = [a.name for a in attachments if a.urn not in group.dependencies]
    assert missing == [], f"{group.name} does not wait for {missing}"


@pytest.mark.parametrize("kind", KINDS)
def test_the_group_runs_the_version_it_is_given_on_the_ami_of_its_type(
    declare: Declare, kind: str
) -> None:
    declared: Declared = declare(lambda: KINDS[kind](kubernetes_version="1.34"))
    group = declared.one(NODE_GROUP).inputs
    assert group["version"] == "1.34"
    assert "releaseVersion" not in group
    # EKS refuses a version for a launch template with a custom AMI: the AMI comes from
    # amiType, so the template must name none.
    template = declared.one(LAUNCH_TEMPLATE).inputs
    assert group["launchTemplate"]["id"] == f"{declared.one(LAUNCH_TEMPLATE).name}-id"
    assert "imageId" not in template
    assert group["amiType"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_group_runs_the_ami_release_it_is_pinned_to(declare: Declare, kind: str) -> None:
    # The stack file's release_version reaches EKS next to the version it belongs to, so that
    # an AMI roll is a change of this one input.
    group = declare(
        lambda: KINDS[kind](kubernetes_version="1.33", release_version="1.33.0-20250704")
    ).one(NODE_GROUP)
    assert (group.inputs["version"], group.inputs["releaseVersion"]) == (
        "1.33",
        "1.33.0-20250704",
    )
