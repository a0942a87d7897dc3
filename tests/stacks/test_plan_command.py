"""``llm-serving plan``: stages, YAML output, validation, errors and the diff between plans."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from operations.cli import app
from stacks.kubernetes_objects import validate_object
from stacks.mock_engine import ProgramRun, RecordedResource
from stacks.plan import diff_runs

runner = CliRunner()


@pytest.mark.parametrize(
    "stack", ["prod-us-east-1", "prod-eu-west-1", "prod-ap-northeast-1", "dev-us-west-2", "global"]
)
def test_plan_runs_for_every_stack(tmp_path: Path, stack: str) -> None:
    result = runner.invoke(app, ["plan", "--stack", stack, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    stages = [line for line in result.output.splitlines() if line.startswith("[")]
    assert [s.split("]")[0] for s in stages] == ["[1/4", "[2/4", "[3/4", "[4/4"]
    assert "(computed)" in result.output or stack == "global"
    written = sorted((tmp_path / stack).rglob("*.yaml"))
    if stack == "global":
        assert written == []
        return
    assert written
    documents = [yaml.safe_load(p.read_text()) for p in written]
    for document in documents:
        # What a reviewer or kubectl reads back is what was validated.
        assert list(document)[:3] == ["apiVersion", "kind", "metadata"]
        assert validate_object(document)[1] is None
    kinds = {d["kind"] for d in documents}
    assert {"Deployment", "Job", "PersistentVolume", "ServiceMonitor"} <= kinds
    assert "llm-serving:model_service:ModelService" in result.output


def test_plan_replaces_an_earlier_plans_objects(tmp_path: Path) -> None:
    stale = tmp_path / "dev-us-west-2" / "llm-serving" / "deployment-gone.yaml"
    stale.parent.mkdir(parents=True)
    stale.write_text("kind: Deployment\n")
    result = runner.invoke(app, ["plan", "--stack", "dev-us-west-2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert not stale.exists()


def test_unknown_stack_is_one_red_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "--stack", "prod-mars-1", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "Pulumi.prod-mars-1.yaml: config: stack file not found" in result.output


def test_against_a_revision_prints_the_difference(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["plan", "--stack", "dev-us-west-2", "--out", str(tmp_path), "--against", "HEAD"]
    )
    assert result.exit_code == 0, result.output
    assert "[4/5] against HEAD:" in result.output
    assert "[5/5] done" in result.output


def test_against_a_missing_revision_fails(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["plan", "--stack", "dev-us-west-2", "--out", str(tmp_path), "--against", "no-such"]
    )
    assert result.exit_code == 1
    assert "--against no-such: git cannot read that revision" in result.output


def _resource(name: str, **inputs: object) -> RecordedResource:
    return RecordedResource(
        urn=f"urn:{name}",
        type="kubernetes:apps/v1:Deployment",
        name=name,
        parent="",
        custom=True,
        inputs=dict(inputs),
    )


def test_diff_lists_added_removed_and_changed_properties() -> None:
    before = ProgramRun(
        resources=[_resource("a", spec={"replicas": 1}), _resource("gone")], outputs={"x": 1}
    )
    after = ProgramRun(
        resources=[_resource("a", spec={"replicas": 2}), _resource("new")], outputs={"x": 1}
    )
    assert diff_runs(before, after) == [
        "~ kubernetes:apps/v1:Deployment  a",
        "    spec.replicas: 1 -> 2",
        "- kubernetes:apps/v1:Deployment  gone",
        "+ kubernetes:apps/v1:Deployment  new",
    ]
    assert diff_runs(after, copy.deepcopy(after)) == []


DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "d"},
    "spec": {
        "selector": {"matchLabels": {"a": "b"}},
        "template": {
            "metadata": {"labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        },
    },
}


def test_validation_checks_built_ins_strictly() -> None:
    assert validate_object(DEPLOYMENT) == (True, None)
    typo = copy.deepcopy(DEPLOYMENT)
    typo["spec"]["replica"] = 2
    has_schema, error = validate_object(typo)
    assert has_schema
    assert error is not None and "replica" in error
    wrong_type = copy.deepcopy(DEPLOYMENT)
    wrong_type["spec"]["replicas"] = "two"
    assert validate_object(wrong_type)[1] is not None


def test_custom_resources_are_checked_for_shape_only() -> None:
    scaled = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "s"}}
    assert validate_object(scaled) == (False, None)
    nameless = {**scaled, "metadata": {}}
    assert validate_object(nameless) == (False, "metadata.name is missing")


def test_without_the_deploy_extra_plan_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A None entry makes the import fail as it does in the serving image (no Pulumi there).
    monkeypatch.setitem(sys.modules, "stacks.plan", None)
    result = runner.invoke(app, ["plan", "--stack", "dev-us-west-2"])
    assert result.exit_code == 1
    assert "pip install 'llm-serving[deploy]'" in result.output
    assert runner.invoke(app, ["version"]).exit_code == 0


def test_against_plans_that_revisions_own_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other revision runs its own components, not the installed ones."""
    import shutil
    import subprocess

    from stacks import plan as plan_module

    repo, current = tmp_path / "repo", plan_module.REPO_ROOT
    for package in ("stacks", "components", "contracts"):
        shutil.copytree(
            current / package,
            repo / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    (repo / "images").mkdir()
    shutil.copy(current / "images" / "compat.toml", repo / "images" / "compat.toml")
    pod = repo / "components" / "model_service" / "pod.py"
    current_grace = '"terminationGracePeriodSeconds": args.termination_grace_seconds'
    assert current_grace in pod.read_text()
    pod.write_text(pod.read_text().replace(current_grace, '"terminationGracePeriodSeconds": 30'))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "older"], cwd=repo, check=True)
    monkeypatch.setattr(plan_module, "REPO_ROOT", repo)

    before = plan_module._plan_revision("HEAD", "dev-us-west-2")
    after = plan_module.plan_program("dev-us-west-2", root=current)
    servers = [
        r
        for r in after.resources
        if "terminationGracePeriodSeconds"
        in r.inputs.get("spec", {}).get("template", {}).get("spec", {})
    ]
    assert len(servers) >= 2
    lines = diff_runs(before, after)
    changed = [line for line in lines if "terminationGracePeriodSeconds" in line]
    assert changed == ["    spec.template.spec.terminationGracePeriodSeconds: 30 -> 120"] * len(
        servers
    )
    assert not [line for line in lines if line.startswith(("+", "-"))]


def test_a_cluster_newer_than_the_schemas_uses_the_newest_schema() -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}}
    assert validate_object(namespace, "1.99") == (True, None)
    assert validate_object({**namespace, "spec": {"finalizer": []}}, "1.99")[1] is not None
