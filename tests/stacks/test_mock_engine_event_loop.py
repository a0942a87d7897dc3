"""The offline plan runs in a process whose event loop an earlier ``asyncio.run`` closed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner

from operations.cli import app


def test_plan_after_asyncio_run_in_the_same_process(tmp_path: Path) -> None:
    asyncio.run(asyncio.sleep(0))
    # Its own --out: the default folder in the checkout is shared with any other run there,
    # and each plan first deletes the stack's folder.
    result = CliRunner().invoke(app, ["plan", "--stack", "dev-us-west-2", "--out", str(tmp_path)])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert "no current event loop" not in result.output
