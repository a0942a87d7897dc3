"""Physical names stay within their services' limits for the longest names the configuration
allows: ids of 40 characters, versions of 63, the longest region stack name."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache

from stacks.config import RegionStackConfig, load_stack_config
from stacks.kubernetes_objects import kubernetes_objects
from stacks.mock_engine import ProgramRun, run_program
from stacks.region_platform import RegionPlatform, RegionPlatformArgs
from tests.components.declared import KnownOutputMocks

STACK = "staging-ap-northeast-1"
GROUP = "l40s-on-demand-capacity-block-reserved-x"
RED_BLACK = "mistral-small-3-1-24b-instruct-rollout-a"
VERSIONED = "llama-3-1-70b-instruct-versioned-model-b"
VERSION = "V2026.11.15_release-candidate-with-a-very-long-build-suffix-001"
# pulumi-aws auto-names "<name>-" and 7 random characters: (type, limit) per AWS's API.
AWS_LIMITS = {
    "aws:iam/role:Role": ("name", 64),
    "aws:iam/rolePolicy:RolePolicy": ("name", 128),
    "aws:eks/nodeGroup:NodeGroup": ("nodeGroupName", 63),
    "aws:ec2/launchTemplate:LaunchTemplate": ("name", 128),
    "aws:ec2/securityGroup:SecurityGroup": ("name", 255),
}
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def test_the_names_used_here_are_the_longest_allowed() -> None:
    assert len(GROUP) == len(RED_BLACK) == len(VERSIONED) == 40
    assert len(VERSION) == 63


def _config() -> RegionStackConfig:
    base = load_stack_config("prod-ap-northeast-1")
    assert isinstance(base, RegionStackConfig)
    raw = base.model_dump(mode="json", exclude_none=True)
    raw["environment"] = "staging"
    raw["namespace"] = "llm-serving-models-of-the-inference-team"
    raw["node_groups"][0]["name"] = GROUP
    model = {"node_group": GROUP, "gpus": 1, "replicas": 1}
    raw["models"] = [
        {
            **model,
            "id": RED_BLACK,
            "versions": [{"version": f"{VERSION[:-1]}0"}, {"version": VERSION}],
        },
        {
            **model,
            "id": VERSIONED,
            "strategy": "versioned",
            "max_replicas": 2,
            "versions": [{"version": f"{VERSION[:-1]}0"}, {"version": VERSION}],
        },
    ]
    return RegionStackConfig.model_validate(raw)


@cache
def _run() -> ProgramRun:
    config = _config()

    def program() -> None:
        RegionPlatform(
            STACK, RegionPlatformArgs(config=config, image_repository_url="r", bucket_name="b")
        )

    return run_program(program, "test", {}, KnownOutputMocks({}), preview=False)


def test_aws_names_fit_their_limits_and_stay_unique() -> None:
    names: Counter[tuple[str, str]] = Counter()
    for resource in _run().resources:
        if resource.type not in AWS_LIMITS:
            continue
        field, limit = AWS_LIMITS[resource.type]
        explicit = resource.inputs.get(field)
        length = len(explicit) if explicit else len(resource.name) + 8
        assert length <= limit, f"{resource.type} {resource.name}: {length} > {limit}"
        names[(resource.type, explicit or resource.name)] += 1
    assert [name for name, count in names.items() if count > 1] == []
    # The long ones did need a name of their own.
    assert any(r.type == "aws:iam/role:Role" and r.inputs.get("name") for r in _run().resources)


def test_services_are_dns_1035_labels_and_jobs_fit_their_label() -> None:
    kinds: Counter[str] = Counter()
    for _, manifest in kubernetes_objects(_run()):
        name = manifest["metadata"]["name"]
        if manifest["kind"] == "Service":
            assert len(name) <= 63 and DNS_1035.match(name), name
        if manifest["kind"] == "Job":
            # The Job controller labels its pods job-name=<name>: a label value.
            assert len(name) <= 63, name
        kinds[manifest["kind"]] += 1
    # Red-Black's stable and canary Services, and one Service per Versioned version.
    assert kinds["Service"] == 4
