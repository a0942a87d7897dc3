"""The mock engine refuses a repeated resource URN as the Pulumi engine does, and the offline
plan reports it in one line instead of passing what `pulumi up` would refuse."""

from __future__ import annotations

import time
from pathlib import Path

import pulumi
import pytest
from typer.testing import CliRunner

from operations.cli import app
from stacks import mock_engine, plan
from stacks.mock_engine import DuplicateURNError, PlanMocks, ProgramRun, run_program


def _twice() -> None:
    pulumi.ComponentResource("test:index:Thing", "same")
    pulumi.ComponentResource("test:index:Thing", "same")


def test_a_repeated_urn_is_refused_with_the_engines_message() -> None:
    with pytest.raises(DuplicateURNError) as caught:
        run_program(_twice, "dev-us-west-2", {}, PlanMocks({}))
    message = str(caught.value)
    assert message.startswith("Duplicate resource URN 'urn:pulumi:dev-us-west-2::llm-serving::")
    assert message.endswith("test:index:Thing::same'; try giving it a unique name")


class _SlowSet(set):
    """A set whose membership test yields the GIL for a while, as a thread switch can."""

    def __contains__(self, item: object) -> bool:
        found = super().__contains__(item)
        time.sleep(0.05)
        return found


class _SlowCheckMonitor(mock_engine._RecordingMonitor):
    def __init__(self, mocks: PlanMocks) -> None:
        super().__init__(mocks)
        self._urns = _SlowSet()


def test_a_repeat_registered_on_another_thread_at_once_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The SDK registers from its executor's threads: without a lock both registrations could be
    # between the check and the insert at once, and both then passed as the first.
    monkeypatch.setattr(mock_engine, "_RecordingMonitor", _SlowCheckMonitor)
    with pytest.raises(DuplicateURNError):
        run_program(_twice, "dev-us-west-2", {}, PlanMocks({}))


def test_same_name_of_another_type_is_not_a_repeat() -> None:
    def program() -> None:
        pulumi.ComponentResource("test:index:Thing", "same")
        pulumi.ComponentResource("test:index:Other", "same")

    run = run_program(program, "dev-us-west-2", {}, PlanMocks({}))
    assert sorted(r.type for r in run.resources) == ["test:index:Other", "test:index:Thing"]


def test_the_plan_reports_a_repeated_urn_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def plan_program(stack: str) -> ProgramRun:
        return run_program(_twice, stack, {}, PlanMocks({}))

    monkeypatch.setattr(plan, "plan_program", plan_program)
    result = CliRunner().invoke(app, ["plan", "--stack", "dev-us-west-2", "--out", str(tmp_path)])
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1
    assert errors[0].startswith("error: Duplicate resource URN 'urn:pulumi:dev-us-west-2::")
    assert "Traceback" not in result.output
