"""What later `pulumi up`s of a region stack do, planned with the real program: a cluster
upgrade takes every node group along, the node groups' sizes follow the stack file, and the
model cache's file system stays where it is (and cannot be replaced by accident)."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from stacks import mock_engine
from stacks.config import STACKS_DIR, StackConfigError
from stacks.mock_engine import PlanMocks, ProgramRun, RecordedResource
from stacks.plan import diff_runs, global_outputs
from stacks.plan_checks import check_plan
from tests.support.stack_plans import REGION_STACKS

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
CLUSTER = "aws:eks/cluster:Cluster"
LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
PROGRAM = STACKS_DIR / "__main__.py"

Edit = Callable[[Any], None]
"""Changes the JSON value of one stack file key in place."""


def _plan(stack: str, key: str = "", edit: Edit | None = None, **mocks: Any) -> ProgramRun:
    """``stack``'s plan with the stack file's ``llm-serving:<key>`` changed by ``edit``."""
    config = mock_engine.stack_config_strings(Path(STACKS_DIR / f"Pulumi.{stack}.yaml"))
    if edit is not None:
        value = json.loads(config[f"llm-serving:{key}"])
        edit(value)
        config[f"llm-serving:{key}"] = json.dumps(value)
    return mock_engine.run_program(PROGRAM, stack, config, PlanMocks(global_outputs(), **mocks))


@cache
def _shipped(stack: str) -> ProgramRun:
    # Not tests.support.stack_plans.stack_plan: made as `_plan` makes the edited plans it is
    # diffed against, so that a diff shows the edit alone.
    return _plan(stack)


def _of(run: ProgramRun, type_: str) -> list[RecordedResource]:
    return [r for r in run.resources if r.type == type_]


def test_a_cluster_upgrade_upgrades_every_node_group_after_the_control_plane() -> None:
    def bump(cluster: dict[str, Any]) -> None:
        cluster["version"] = "1.34"

    before, after = _shipped("prod-us-east-1"), _plan("prod-us-east-1", "cluster", bump)
    (cluster,) = _of(after, CLUSTER)
    groups = _of(after, NODE_GROUP)
    assert {g.name for g in groups} == {
        "prod-us-east-1-system-nodes",
        "prod-us-east-1-h100-nodes",
        "prod-us-east-1-l40s-nodes",
    }
    for group in groups:
        assert group.inputs["version"] == cluster.inputs["version"] == "1.34", group.name
        # The created cluster's version output: EKS upgrades nodes only up to the control plane.
        assert cluster.urn in group.property_dependencies["version"], group.name
    changed = [line for line in diff_runs(before, after) if line.startswith("~")]
    assert sorted(changed) == sorted(
        [f"~ {CLUSTER}  {cluster.name}", *(f"~ {NODE_GROUP}  {g.name}" for g in groups)]
    )


def test_node_groups_of_an_adopted_cluster_run_its_version() -> None:
    run = _plan("prod-eu-west-1", adopted_cluster_version="1.32")
    assert not _of(run, CLUSTER)
    groups = _of(run, NODE_GROUP)
    assert groups
    assert {g.name: g.inputs.get("version") for g in groups} == {g.name: "1.32" for g in groups}


def _pin_h100(release: str) -> Edit:
    def edit(groups: list[dict[str, Any]]) -> None:
        (h100,) = (g for g in groups if g["name"] == "h100")
        h100["release_version"] = release

    return edit


def test_an_ami_roll_is_one_changed_input_of_one_node_group() -> None:
    # docs/stacks.md, Pinning the AMI release: what the reviewer sees in the diff.
    pinned = _plan("prod-us-east-1", "node_groups", _pin_h100("1.33.0-20250704"))
    rolled = _plan("prod-us-east-1", "node_groups", _pin_h100("1.33.5-20251120"))
    group = f"~ {NODE_GROUP}  prod-us-east-1-h100-nodes"
    assert diff_runs(_shipped("prod-us-east-1"), pinned) == [
        group,
        "    releaseVersion: (absent) -> 1.33.0-20250704",
    ]
    assert diff_runs(pinned, rolled) == [
        group,
        "    releaseVersion: 1.33.0-20250704 -> 1.33.5-20251120",
    ]


def test_a_cluster_upgrade_takes_a_pinned_amazon_linux_release_along() -> None:
    def upgrade(release: str) -> Edit:
        def edit(cluster: dict[str, Any]) -> None:
            cluster["version"] = "1.34"
            cluster["system_nodes"] = {"release_version": release}

        return edit

    with pytest.raises(StackConfigError) as caught:
        _plan("prod-us-east-1", "cluster", upgrade("1.33.0-20250704"))
    assert caught.value.key == "llm-serving:cluster.system_nodes.release_version"
    run = _plan("prod-us-east-1", "cluster", upgrade("1.34.1-20250920"))
    (system,) = (g for g in _of(run, NODE_GROUP) if g.name == "prod-us-east-1-system-nodes")
    assert (system.inputs["version"], system.inputs["releaseVersion"]) == (
        "1.34",
        "1.34.1-20250920",
    )


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_no_node_group_leaves_its_size_to_an_autoscaler(stack: str) -> None:
    # No cluster autoscaler or Karpenter is deployed: the stack file owns every size.
    for group in _of(_shipped(stack), NODE_GROUP):
        assert not group.options.get("ignoreChanges"), group.name


def test_draining_a_capacity_block_group_asks_eks_for_zero_nodes() -> None:
    # docs/stacks.md, Capacity Block node groups, step 1.
    def drain(groups: list[dict[str, Any]]) -> None:
        (block,) = (g for g in groups if g.get("capacity_type") == "CAPACITY_BLOCK")
        block.update(min_size=0, desired_size=0)

    run = _plan("prod-us-east-1", "node_groups", drain)
    (group,) = (g for g in _of(run, NODE_GROUP) if g.name == "prod-us-east-1-h100-nodes")
    assert group.inputs["scalingConfig"] == {"minSize": 0, "desiredSize": 0, "maxSize": 8}
    assert "scalingConfig.desiredSize" not in group.options.get("ignoreChanges", [])


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_reordering_the_private_subnets_leaves_the_model_cache_alone(stack: str) -> None:
    def rotate(network: dict[str, Any]) -> None:
        subnets = network["private_subnet_ids"]
        network["private_subnet_ids"] = subnets[1:] + subnets[:1]

    changed = diff_runs(_shipped(stack), _plan(stack, "network", rotate))
    assert not [line for line in changed if line.startswith(f"~ {LUSTRE}")], changed


def test_the_cache_subnet_defaults_to_the_first_private_subnet() -> None:
    def unpin(cache_config: dict[str, Any]) -> None:
        del cache_config["subnet_id"]

    def pin_second(cache_config: dict[str, Any]) -> None:
        cache_config["subnet_id"] = "subnet-0a1b2c3d4e5f60012"

    (unpinned,) = _of(_plan("prod-us-east-1", "model_cache", unpin), LUSTRE)
    assert unpinned.inputs["subnetIds"] == "subnet-0a1b2c3d4e5f60011"
    (pinned,) = _of(_plan("prod-us-east-1", "model_cache", pin_second), LUSTRE)
    assert pinned.inputs["subnetIds"] == "subnet-0a1b2c3d4e5f60012"


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_the_model_cache_file_system_is_protected(stack: str) -> None:
    # A replacement (or deletion) fails in preview instead of dropping the cache.
    (file_system,) = _of(_shipped(stack), LUSTRE)
    assert file_system.options.get("protect") is True
    assert not file_system.options.get("retainOnDelete")


def test_a_version_the_configuration_accepts_plans_with_valid_labels() -> None:
    # ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$ accepts v5_, whose raw value is no label value.
    def add_version(models: list[dict[str, Any]]) -> None:
        (ranker,) = (m for m in models if m["strategy"] == "versioned")
        ranker["versions"][0]["route_weight"] = 10
        ranker["versions"][1]["route_weight"] = 90
        ranker["versions"].append({"version": "v5_"})

    run = _plan("prod-us-east-1", "models", add_version)
    assert [f"{f.check}: {f.message}" for f in check_plan(run)] == []
    labels = {
        r.type.rsplit(":", 1)[1]: r.inputs["metadata"]["labels"]["llm-serving/model-version"]
        for r in run.resources
        if r.name.startswith("prod-us-east-1-catalog-ranker-8b-v5-")
        and r.type.startswith("kubernetes:")
        and r.type.rsplit(":", 1)[1] in ("GRPCRoute", "HTTPRoute", "Service", "Deployment")
    }
    assert labels == dict.fromkeys(("GRPCRoute", "HTTPRoute", "Service", "Deployment"), "v5")
