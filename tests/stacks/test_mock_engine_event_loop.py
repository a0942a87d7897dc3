"""The offline plan runs in a process whose event loop an earlier ``asyncio.run`` closed."""

from __future__ import annotations

import asyncio

from typer.testing import CliRunner

from runtime.cli import app


def test_plan_after_asyncio_run_in_the_same_process() -> None:
    asyncio.run(asyncio.sleep(0))
    result = CliRunner().invoke(app, ["plan", "--stack", "dev-us-west-2"])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert "no current event loop" not in result.output
