"""The GitHub workflows: valid against the workflow schema, clean under zizmor (offline), and
shaped as the review loop promises (pinned actions, OIDC only where used, one region at a time)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.stack_plans import REGION_STACKS

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent
# The workflows' matrices list the region stacks dev first, then the prod ones in order.
MATRIX_STACKS = sorted(REGION_STACKS, key=lambda stack: not stack.startswith("dev-"))
PINNED = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")


def load(name: str) -> dict[str, Any]:
    # PyYAML reads the key `on` as True; workflows are read as GitHub reads them.
    document = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text(encoding="utf-8"))
    document["on"] = document.pop(True)
    return document


def steps_using(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [s for s in job["steps"] if s.get("uses", "").split("@")[0] == action]


def test_workflows_exist() -> None:
    assert [p.name for p in WORKFLOWS] == ["deploy.yml", "pull-request.yml"]


def test_workflows_match_the_github_workflow_schema() -> None:
    done = subprocess.run(
        [
            str(BIN / "check-jsonschema"),
            "--builtin-schema",
            "vendor.github-workflows",
            *map(str, WORKFLOWS),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_zizmor_offline_has_no_findings() -> None:
    done = subprocess.run(
        [
            str(BIN / "zizmor"),
            "--offline",
            "--persona",
            "pedantic",
            "--format",
            "plain",
            str(ROOT / ".github" / "workflows"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No findings to report" in done.stdout + done.stderr


@pytest.mark.parametrize("name", ["deploy.yml", "pull-request.yml"])
def test_actions_pinned_and_permissions_least(name: str) -> None:
    workflow = load(name)
    assert workflow["permissions"] == {}
    for job_name, job in workflow["jobs"].items():
        for step in job["steps"]:
            if "uses" in step:
                assert PINNED.match(step["uses"]), f"{job_name}: {step['uses']} is not a SHA pin"
            if "actions/checkout@" in step.get("uses", ""):
                assert step["with"]["persist-credentials"] is False
        oidc = bool(steps_using(job, "aws-actions/configure-aws-credentials"))
        assert (job["permissions"].get("id-token") == "write") == oidc, job_name
        assert set(job["permissions"]) <= {"contents", "id-token", "pull-requests"}
        assert job["permissions"]["contents"] == "read"


def test_pull_request_runs_tests_then_plan_diff_and_commented_previews() -> None:
    workflow = load("pull-request.yml")
    assert list(workflow["on"]) == ["pull_request"]
    jobs = workflow["jobs"]
    assert any(s.get("run") == "make test" for s in jobs["test"]["steps"])
    assert jobs["plan-diff"]["needs"] == jobs["preview"]["needs"] == "test"
    assert jobs["plan-diff"]["strategy"]["matrix"]["stack"] == MATRIX_STACKS
    assert "id-token" not in jobs["plan-diff"]["permissions"]
    plan = jobs["plan-diff"]["steps"][-1]
    assert '--against "origin/$BASE_REF"' in plan["run"] and "${{" not in plan["run"]
    stacks = [entry["stack"] for entry in jobs["preview"]["strategy"]["matrix"]["include"]]
    assert stacks == MATRIX_STACKS
    (pulumi,) = steps_using(jobs["preview"], "pulumi/actions")
    assert pulumi["with"]["command"] == "preview"
    assert pulumi["with"]["diff"] is True and pulumi["with"]["comment-on-pr"] is True
    assert pulumi["with"]["policyPacks"] == "policy"
    assert jobs["preview"]["permissions"]["pull-requests"] == "write"


def test_deploy_goes_one_region_at_a_time_and_stops_at_first_failure() -> None:
    workflow = load("deploy.yml")
    assert workflow["on"] == {"push": {"branches": ["main"]}}
    assert workflow["concurrency"]["cancel-in-progress"] is False
    up = workflow["jobs"]["up"]
    assert up["needs"] == "test"
    assert up["strategy"]["max-parallel"] == 1 and up["strategy"]["fail-fast"] is True
    stacks = [entry["stack"] for entry in up["strategy"]["matrix"]["include"]]
    assert stacks == ["global", *MATRIX_STACKS]
    (pulumi,) = steps_using(up, "pulumi/actions")
    assert pulumi["with"]["command"] == "up" and pulumi["with"]["policyPacks"] == "policy"
    assert pulumi["with"]["refresh"] is True


def test_matrix_covers_the_stack_files_when_present() -> None:
    # The stack files come from the region-stacks work; once merged they must match the matrix.
    found = sorted(
        p.name.removeprefix("Pulumi.").removesuffix(".yaml")
        for p in (ROOT / "stacks").glob("Pulumi.*.yaml")
        if p.name != "Pulumi.global.yaml"
    )
    assert found in ([], sorted(REGION_STACKS))
