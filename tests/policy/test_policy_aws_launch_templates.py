"""The stack check for node groups whose GPU instance type is named only in their launch template
(a ``CUSTOM`` AMI), over plain dicts shaped as the CrossGuard stack view hands them."""

from __future__ import annotations

import pytest

from policy.aws import StackResource, check_gpu_launch_template_tainted

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
ROLE = "aws:iam/role:Role"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}
NO_TAINT_MESSAGE = "has no taint {key: nvidia.com/gpu, effect: NO_SCHEDULE}; add it to taints"


def template(
    name: str, instance_type: str | None, resource_type: str = LAUNCH_TEMPLATE, **extra: object
) -> StackResource:
    props = {"name": f"{name}-2f1a", **extra}
    if instance_type is not None:
        props["instanceType"] = instance_type
    return StackResource(urn=f"urn:lt:{name}", type=resource_type, name=name, props=props)


def node_group(
    launch_template: dict[str, object], depends_on: list[str], **extra: object
) -> StackResource:
    props = {"clusterName": "prod", "amiType": "CUSTOM", "launchTemplate": launch_template}
    return StackResource(
        urn="urn:ng:serving",
        type=NODE_GROUP,
        name="serving-nodes",
        props={**props, **extra},
        property_dependencies={"launchTemplate": depends_on} if depends_on else {},
    )


@pytest.mark.parametrize("instance_type", ["p5.48xlarge", "g6e.xlarge"])
def test_gpu_launch_template_joined_by_property_dependency_fails(instance_type: str) -> None:
    # In a preview the launch template's id is not known yet: only the dependency joins them.
    lt = template("serving-lt", instance_type)
    group = node_group({"version": "1"}, [lt.urn])
    assert check_gpu_launch_template_tainted(group, [group, lt]) == [
        f"GPU node group serving-nodes (instanceType {instance_type} in launch template "
        f"serving-lt) {NO_TAINT_MESSAGE}"
    ]


@pytest.mark.parametrize(
    ("reference", "lt_extra"),
    [({"id": "lt-0abc", "version": "3"}, {"id": "lt-0abc"}), ({"name": "serving-lt-2f1a"}, {})],
)
def test_gpu_launch_template_matched_by_id_or_name_fails(
    reference: dict[str, object], lt_extra: dict[str, object]
) -> None:
    other = template("other-lt", "m7i.4xlarge", id="lt-0fff")
    lt = template("serving-lt", "p5.48xlarge", **lt_extra)
    group = node_group(reference, [])
    messages = check_gpu_launch_template_tainted(group, [other, group, lt])
    assert len(messages) == 1 and "launch template serving-lt)" in messages[0]


def test_tainted_gpu_launch_template_node_group_passes() -> None:
    lt = template("serving-lt", "p5.48xlarge")
    group = node_group({"version": "1"}, [lt.urn], taints=[GPU_TAINT])
    assert check_gpu_launch_template_tainted(group, [group, lt]) == []


@pytest.mark.parametrize(
    ("resource_type", "instance_type"),
    [(LAUNCH_TEMPLATE, "m7i.4xlarge"), (LAUNCH_TEMPLATE, None), (ROLE, "p5.48xlarge")],
)
def test_cpu_or_unrelated_dependencies_pass(resource_type: str, instance_type: str | None) -> None:
    dependency = template("cpu-lt", instance_type, resource_type=resource_type)
    group = node_group({"version": "1"}, [dependency.urn])
    assert check_gpu_launch_template_tainted(group, [group, dependency]) == []


def test_node_group_with_its_own_gpu_evidence_is_left_to_the_per_resource_policy() -> None:
    # gpu-node-groups-tainted already reports this one; reporting it twice helps nobody.
    lt = template("serving-lt", "p5.48xlarge")
    group = node_group({"version": "1"}, [lt.urn], amiType="AL2023_x86_64_NVIDIA")
    assert check_gpu_launch_template_tainted(group, [group, lt]) == []


def test_only_node_groups_are_checked() -> None:
    lt = template("serving-lt", "p5.48xlarge")
    assert check_gpu_launch_template_tainted(lt, [lt]) == []
