"""Running one of the pod's programs (``python -m runtime.<name>``) for a run that exits at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
