"""The plan shows what the cloud computes as computed, as ``pulumi preview`` does, never as null:
the created cluster's security group in GPU launch templates and the nodes' ingress rule."""

from __future__ import annotations

from typing import Any

import pytest

from stacks.mock_engine import COMPUTED, NESTED_COMPUTED_OUTPUTS
from stacks.plan import format_tree
from tests.support.stack_plans import REGION_STACKS, stack_plan


def _nulls(value: Any, path: str = "") -> list[str]:
    if value is None:
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _nulls(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _nulls(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_no_input_of_any_plan_is_null(stack: str) -> None:
    nulls = [f"{r.name}{p}" for r in stack_plan(stack).resources for p in _nulls(r.inputs)]
    assert nulls == []


def test_the_created_clusters_security_group_is_computed() -> None:
    run = stack_plan("dev-us-west-2")
    templates = [r for r in run.resources if r.name.endswith("l4-spot-launch-template")]
    (template,) = templates
    assert template.inputs["vpcSecurityGroupIds"] == [COMPUTED, COMPUTED]
    (rule,) = [r for r in run.resources if r.name.endswith("gpu-nodes-from-cluster")]
    assert rule.inputs["referencedSecurityGroupId"] == COMPUTED
    tree = format_tree(run)
    at = tree.index(next(line for line in tree if line.endswith("l4-spot-launch-template")))
    # What the reviewer reads in the printed plan.
    assert f'vpcSecurityGroupIds: ["{COMPUTED}", "{COMPUTED}"]' in "\n".join(tree[at : at + 4])


def test_an_adopted_clusters_security_group_is_known() -> None:
    # getCluster answers for an adopted cluster: its security group is known before the run.
    run = stack_plan("prod-eu-west-1")
    (template,) = [r for r in run.resources if r.name.endswith("l40s-launch-template")]
    assert all(sg.startswith("sg-") for sg in template.inputs["vpcSecurityGroupIds"])


def test_nested_computed_outputs_name_real_properties() -> None:
    import pulumi_aws as aws

    # The table's paths are properties of the provider's output types (camelCase there).
    vpc = aws.eks.outputs.ClusterVpcConfig
    for path in NESTED_COMPUTED_OUTPUTS["aws:eks/cluster:Cluster"]:
        head, leaf = path.split(".")
        assert head == "vpcConfig"
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in leaf)
        assert hasattr(vpc, snake), path
