"""Running one of the pod's programs (``python -m runtime.<name>``) for a run that exits at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pydantic_settings import BaseSettings

from runtime.settings_env import variable_for

ROOT = Path(__file__).resolve().parents[2]
# The programs' own variables are dropped from the test's environment: only ``env`` sets them.
_OWN_PREFIXES = ("LLM_SERVING_", "METRICS_PROXY_")


def run_program(
    module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` with ``env`` over a clean environment, its output captured."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_OWN_PREFIXES)}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env={**clean, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def check_help(module: str, model: type[BaseSettings], *lines: str) -> str:
    """``--help`` exits 0 with the usage line, every variable of ``model`` and ``lines``;
    returns the program's stderr (nothing should have started)."""
    done = run_program(module, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m {module} [-h]")
    for name in model.model_fields:
        assert f"  {variable_for(model, name)} (default: " in done.stdout, name
    for line in lines:
        assert line in done.stdout
    return done.stderr


def check_refused_arguments(module: str, *args: str) -> str:
    """Any argument but ``--help`` exits 2 with the usage line; returns the program's stderr."""
    done = run_program(module, *args)
    assert done.returncode == 2
    assert done.stderr.startswith(f"usage: python -m {module} [-h]\n")
    assert "unrecognized arguments" in done.stderr
    return done.stderr
