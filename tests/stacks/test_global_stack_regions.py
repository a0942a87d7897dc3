"""A region stack whose region the global stack does not replicate to fails in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from stacks import plan
from stacks.config import STACKS_DIR, stack_file

# The Pulumi CLI's Python host, in brief: a RunError's message alone, anything else with the
# traceback. In its own process, as there, so that the failed run leaves nothing behind here.
# os._exit after the message: the failed run's event loop is otherwise closed by the garbage
# collector at interpreter exit, after its selector, which now and then prints an unrelated
# "Exception ignored in BaseEventLoop.__del__" (seen once in CI).
_PULUMI_UP = """
import json, os, sys
from pathlib import Path
import pulumi
from stacks.mock_engine import PlanMocks, run_program, stack_config_strings
program, config, outputs = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
try:
    run_program(program, "dev-us-west-2", stack_config_strings(config), PlanMocks(outputs))
except pulumi.RunError as exc:
    print(f"error: {exc}", file=sys.stderr, flush=True)
    os._exit(1)
"""


def _without(region: str) -> dict[str, Any]:
    outputs = plan.global_outputs()
    return {name: {r: v for r, v in by.items() if r != region} for name, by in outputs.items()}


def test_the_program_names_aws_region_once_the_global_outputs_arrive() -> None:
    # In `pulumi up` the global stack's outputs are known only inside an apply.
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _PULUMI_UP,
            str(STACKS_DIR / "__main__.py"),
            str(stack_file("dev-us-west-2")),
            json.dumps(_without("us-west-2")),
        ],
        capture_output=True,
        text=True,
        cwd=STACKS_DIR.parent,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"error: {stack_file('dev-us-west-2')}: aws:region: the global stack "
        "'llm-serving/global' has no replica in us-west-2 (it has: ap-northeast-1, eu-west-1, "
        f"us-east-1); add us-west-2 to llm-serving:replica_regions in "
        f"{stack_file('global')} and update the global stack first"
    ]


def test_the_plan_checks_the_region_before_running_the_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outputs = _without("us-west-2")
    monkeypatch.setattr(plan, "global_outputs", lambda: outputs)
    lines: list[str] = []
    with pytest.raises(plan.PlanError, match=r"aws:region: .*llm-serving:replica_regions"):
        plan.run_plan("dev-us-west-2", echo=lines.append)
    assert lines == [], "refused before stage 1 reports the stack file valid"
