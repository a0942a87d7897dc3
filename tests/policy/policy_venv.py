"""Runs a script in the policy pack's own virtualenv (``.venv-policy``), cases passed as JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
POLICY_PYTHON = ROOT / ".venv-policy" / "bin" / "python"


def run_in_policy_venv(script: str, cases: Any, *args: str) -> Any:
    """``script`` run with ``ROOT`` and ``args`` as argv, ``cases`` on stdin; its JSON answer."""
    assert POLICY_PYTHON.exists(), "run `make setup` to build .venv-policy for the policy pack"
    done = subprocess.run(
        [str(POLICY_PYTHON), "-c", script, str(ROOT), *args],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)
