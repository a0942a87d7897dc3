"""The ``llm-serving package`` commands hand off to the package module and report errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from runtime.cli import app
from tests.runtime.wheelmaker import make_source, make_toy_plugin

runner = CliRunner()


def test_build_inspect_verify(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    out = tmp_path / "out"
    result = runner.invoke(app, ["package", "build", str(source), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "built toy/v1" in result.output
    result = runner.invoke(app, ["package", "inspect", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["catalogs"] == ["titles"]
    result = runner.invoke(app, ["package", "verify", str(out)])
    assert result.exit_code == 0 and "ok: toy/v1" in result.output


def test_refusal_is_one_line_and_exit_code_1(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    make_toy_plugin(source / "plugins", "vllm>=0.30")
    result = runner.invoke(app, ["package", "build", str(source), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert result.output.startswith("error: plugin wheel plugins/toy_plugin-1.0-py3-none-any.whl")
    assert len(result.output.strip().splitlines()) == 1


def test_verify_reports_corruption(tmp_path: Path) -> None:
    out = tmp_path / "out"
    runner.invoke(app, ["package", "build", str(make_source(tmp_path / "src")), "--out", str(out)])
    (out / "weights" / "config.json").write_text('{"architectures": ["Evil"]}')
    result = runner.invoke(app, ["package", "verify", str(out)])
    assert result.exit_code == 1 and "weights/config.json" in result.output
