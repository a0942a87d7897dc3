"""``llm-serving versions gc`` invoked through typer's ``CliRunner``, as the tests call it."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner, Result

from operations.cli import app


def run_gc(stack: str, prometheus_url: str, stacks_dir: Path, *extra: str) -> Result:
    """``versions gc --stack STACK --prometheus URL --stacks-dir DIR`` followed by ``extra``."""
    return CliRunner().invoke(
        app,
        [
            "versions",
            "gc",
            "--stack",
            stack,
            "--prometheus",
            prometheus_url,
            "--stacks-dir",
            str(stacks_dir),
            *extra,
        ],
    )
