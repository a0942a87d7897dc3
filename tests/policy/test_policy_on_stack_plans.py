"""The policy pack's validators over every shipped stack's offline plan: every resource the
stack program declares passes every mandatory policy, and the advisory age policy sees the
Versioned Services' ``created-at`` annotation.

The program runs under the plan's mocks with every cloud-computed value given a stand-in
(``KnownOutputMocks``), so documents a preview leaves unknown (IRSA trust policies that name the
cluster's OIDC provider) are checked too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import cache

import pytest

from contracts.compat import load_matrix
from policy import aws, workloads
from policy.findings import Props
from policy.versions import check_versioned_age
from stacks.config import RegionStackConfig, load_stack_config
from stacks.mock_engine import ProgramRun, run_program, stack_config_strings
from stacks.plan import REPO_ROOT, global_outputs
from tests.components.declared import KnownOutputMocks

STACKS = ["global", "prod-us-east-1", "prod-eu-west-1", "prod-ap-northeast-1", "dev-us-west-2"]
ROLLOUT = "kubernetes:argoproj.io/v1alpha1:Rollout"

Validator = Callable[[str, Props], list[str]]


def _mandatory() -> dict[str, Validator]:
    pairs = load_matrix().supported
    return {
        "gpu-node-groups-tainted": aws.check_gpu_node_group_tainted,
        "gpu-pods-tolerate-taint": workloads.check_gpu_pods_tolerate_taint,
        "gpu-containers-startup-probe": workloads.check_gpu_startup_probes,
        "images-pinned": workloads.check_images_pinned,
        "serving-pair-in-compat-matrix": lambda t, p: workloads.check_serving_pair_supported(
            t, p, pairs
        ),
        "fsx-encrypted": aws.check_fsx_encrypted,
        "lustre-not-public": aws.check_lustre_not_public,
        "imdsv2-required": aws.check_imdsv2_required,
        "irsa-trust-scoped": aws.check_irsa_trust_scoped,
        "s3-access-scoped-to-prefix": aws.check_s3_access_scoped_to_prefix,
        "red-black-steps-end-at-100-with-analysis": workloads.check_red_black_steps,
    }


@cache
def _run(stack: str) -> ProgramRun:
    return _run_with(stack, stack_config_strings(REPO_ROOT / "stacks" / f"Pulumi.{stack}.yaml"))


def _run_with(stack: str, config: dict[str, str]) -> ProgramRun:
    stacks_dir = REPO_ROOT / "stacks"
    return run_program(
        stacks_dir / "__main__.py",
        stack,
        config,
        KnownOutputMocks(global_outputs(stacks_dir)),
        preview=False,
    )


def _stack_resources(run: ProgramRun) -> list[aws.StackResource]:
    return [
        aws.StackResource(
            urn=r.urn,
            type=r.type,
            name=r.name,
            props=r.inputs,
            property_dependencies=r.property_dependencies,
        )
        for r in run.resources
    ]


def _violations(run: ProgramRun) -> list[str]:
    stack = _stack_resources(run)
    return [
        f"{policy}: {resource.type} {resource.name}: {message}"
        for resource in run.resources
        for policy, validate in _mandatory().items()
        for message in validate(resource.type, resource.inputs)
    ] + [
        f"gpu-launch-template-node-groups-tainted: {resource.type} {resource.name}: {message}"
        for resource in stack
        for message in aws.check_gpu_launch_template_tainted(resource, stack)
    ]


@pytest.mark.parametrize("stack", STACKS)
def test_every_resource_passes_every_mandatory_policy(stack: str) -> None:
    assert _violations(_run(stack)) == []


@pytest.mark.parametrize("stack", STACKS[1:])
def test_the_policies_see_what_they_guard(stack: str) -> None:
    # A validator that never meets its resource type would pass vacuously.
    config = load_stack_config(stack)
    assert isinstance(config, RegionStackConfig)
    workloads_ = {
        ROLLOUT if m.strategy == "red-black" else "kubernetes:apps/v1:Deployment"
        for m in config.models
    }
    types = {r.type for r in _run(stack).resources}
    assert {
        "aws:eks/nodeGroup:NodeGroup",
        "aws:ec2/launchTemplate:LaunchTemplate",
        "aws:fsx/lustreFileSystem:LustreFileSystem",
        "aws:iam/role:Role",
        "aws:iam/rolePolicy:RolePolicy",
        *workloads_,
    } <= types
    trust = [
        r.inputs["assumeRolePolicy"]
        for r in _run(stack).resources
        if r.type == "aws:iam/role:Role" and "WebIdentity" in str(r.inputs["assumeRolePolicy"])
    ]
    assert trust and all(t.startswith("{") for t in trust), "IRSA trust must be known here"


def test_a_broken_rollout_in_a_plan_is_caught() -> None:
    rollout = next(r for r in _run("prod-us-east-1").resources if r.type == ROLLOUT)
    spec = rollout.inputs["spec"]
    canary = {**spec["strategy"]["canary"], "steps": [{"setWeight": 50}]}
    broken = {**rollout.inputs, "spec": {**spec, "strategy": {"canary": canary}}}
    assert workloads.check_red_black_steps(ROLLOUT, broken)
    unpinned = {
        **rollout.inputs,
        "spec": {
            **spec,
            "template": {
                **spec["template"],
                "metadata": {},
                "spec": {
                    **spec["template"]["spec"],
                    "containers": [
                        {**spec["template"]["spec"]["containers"][0], "image": "triton:latest"}
                    ],
                },
            },
        },
    }
    assert workloads.check_images_pinned(ROLLOUT, unpinned)
    assert _mandatory()["serving-pair-in-compat-matrix"](ROLLOUT, unpinned)


def test_a_custom_ami_node_group_with_a_gpu_launch_template_in_a_plan_is_caught() -> None:
    # The plan's own node group, turned into a CUSTOM AMI whose GPU type only its template names.
    stack = _stack_resources(_run("prod-us-east-1"))
    group = next(r for r in stack if r.type == "aws:eks/nodeGroup:NodeGroup")
    own = {k: v for k, v in group.props.items() if k not in ("instanceTypes", "labels", "taints")}
    custom = replace(group, props={**own, "amiType": "CUSTOM"})
    depends_on = set(group.property_dependencies["launchTemplate"])
    gpu_stack = [
        replace(r, props={**r.props, "instanceType": "p5.48xlarge"})
        if r.type == "aws:ec2/launchTemplate:LaunchTemplate" and r.urn in depends_on
        else r
        for r in stack
    ]
    assert aws.check_gpu_launch_template_tainted(custom, stack) == []
    messages = aws.check_gpu_launch_template_tainted(custom, gpu_stack)
    assert len(messages) == 1
    assert messages[0].startswith(f"GPU node group {group.name} (instanceType p5.48xlarge in ")


def _aged(config: dict[str, str] | None = None) -> dict[str, list[str]]:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    return {
        resource.inputs["metadata"]["name"]: messages
        for resource in (
            _run("prod-us-east-1") if config is None else _run_with("prod-us-east-1", config)
        ).resources
        if (
            messages := check_versioned_age(
                resource.type, resource.inputs, idle=timedelta(days=30), now=now
            )
        )
    }


def test_advisory_age_policy_flags_old_versioned_services_from_created_at() -> None:
    # v3 (2026-09-20) is older than 30 days, but it carries a route weight, which keeps it out
    # of versions gc at any age; v4 is the newest. So the shipped stack draws no advice ...
    assert _aged() == {}
    # ... and without route weights v3 is flagged.
    config = stack_config_strings(REPO_ROOT / "stacks" / "Pulumi.prod-us-east-1.yaml")
    models = json.loads(config["llm-serving:models"])
    for model in models:
        for version in model.get("versions", []):
            version.pop("route_weight", None)
    config["llm-serving:models"] = json.dumps(models)
    flagged = _aged(config)
    assert list(flagged) == ["catalog-ranker-8b-v3"]
    assert "versions gc" in flagged["catalog-ranker-8b-v3"][0]
