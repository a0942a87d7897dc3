"""RegionPlatform's nodes: materialize Jobs land only where the Lustre security group admits the
node, and a created cluster's system nodes (the cluster security group alone) are not there."""

from __future__ import annotations

from functools import cache

import pytest

from components.gpu_node_group import NODE_GROUP_LABEL
from stacks.config import RegionStackConfig, load_stack_config
from stacks.mock_engine import ProgramRun, run_program
from stacks.region_platform import RegionPlatform, RegionPlatformArgs
from tests.components.declared import KnownOutputMocks

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
# What KnownOutputMocks answers for a created cluster's cluster security group.
CLUSTER_SG = "sg-0cluster"


@cache
def _run(stack: str) -> ProgramRun:
    config = load_stack_config(stack)
    assert isinstance(config, RegionStackConfig)

    def program() -> None:
        RegionPlatform(
            "r", RegionPlatformArgs(config=config, image_repository_url="repo", bucket_name="b")
        )

    return run_program(program, "test", {}, KnownOutputMocks({}), preview=False)


def _node_security_groups(run: ProgramRun) -> dict[str, set[str]]:
    """Each node group's ``llm-serving/node-group`` label (or name) and its nodes' groups."""
    templates = {f"{r.name}-id": r.inputs for r in run.resources if r.type == LAUNCH_TEMPLATE}
    found = {}
    for group in (r for r in run.resources if r.type == NODE_GROUP):
        template = templates[group.inputs["launchTemplate"]["id"]]
        # EKS gives the cluster security group to nodes whose template names none.
        found[group.inputs["labels"].get(NODE_GROUP_LABEL, group.name)] = set(
            template.get("vpcSecurityGroupIds") or [CLUSTER_SG]
        )
    return found


def _lustre_clients(run: ProgramRun) -> set[str]:
    lustre = next(
        f"{r.name}-id"
        for r in run.resources
        if r.type == "aws:ec2/securityGroup:SecurityGroup" and r.name.endswith("-lustre")
    )
    return {
        r.inputs["referencedSecurityGroupId"]
        for r in run.resources
        if r.type == INGRESS
        and r.inputs["securityGroupId"] == lustre
        and r.inputs["fromPort"] == 988
    }


@pytest.mark.parametrize("stack", ["prod-us-east-1", "prod-eu-west-1", "dev-us-west-2"])
def test_materialize_jobs_run_only_on_nodes_that_reach_lustre(stack: str) -> None:
    run = _run(stack)
    clients, groups = _lustre_clients(run), _node_security_groups(run)
    jobs = [
        r.inputs["spec"]["template"]["spec"]
        for r in run.resources
        if r.type == "kubernetes:batch/v1:Job"
        and r.inputs["metadata"]["name"].startswith("materialize-")
    ]
    assert jobs
    for pod in jobs:
        required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ((expression,),) = [term["matchExpressions"] for term in required["nodeSelectorTerms"]]
        assert (expression["key"], expression["operator"]) == (NODE_GROUP_LABEL, "In")
        assert expression["values"]
        for group in expression["values"]:
            assert groups[group] & clients, f"{group} cannot reach the Lustre ports"


def test_system_nodes_are_no_lustre_clients() -> None:
    run = _run("prod-us-east-1")
    (system,) = (r for r in run.resources if r.type == NODE_GROUP and not r.inputs.get("taints"))
    assert not _node_security_groups(run)[system.name] & _lustre_clients(run)
