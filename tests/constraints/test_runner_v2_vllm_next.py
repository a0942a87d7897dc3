"""The Model Runner V2 adapter under the next vLLM (``.venv-vllm-next``, built by make setup).

vLLM >= 0.32 refuses entry-point processors that do not derive from its V2 interface, and one
package must serve both runners. This runs ``vllm_next_checks.py`` (vLLM's own loader,
validator and builder) and the V2 property test with that venv's interpreter.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEXT_PYTHON = ROOT / ".venv-vllm-next" / "bin" / "python"


# Above the child's own limit, so that it, not the suite's 300 s default, ends a stuck run (with
# the child's output): 18 s idle, 50 s on a loaded 2-core machine.
@pytest.mark.timeout(660)
def test_adapter_under_the_next_vllm() -> None:
    assert NEXT_PYTHON.exists(), "run `make setup` to build .venv-vllm-next"
    done = subprocess.run(
        [
            str(NEXT_PYTHON),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/constraints/vllm_next_checks.py",
            "tests/constraints/test_runner_v2_properties.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "7 passed" in done.stdout, done.stdout[-2000:]
