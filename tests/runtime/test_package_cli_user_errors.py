"""User errors in files and options reach the CLI user as one ``error:`` line and exit code 1,
never as a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from operations.cli import app
from runtime.package import build_package
from tests.runtime.wheelmaker import make_source

runner = CliRunner()


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A source tree and its version folder, plus copies with one file not UTF-8."""
    root = tmp_path_factory.mktemp("trees")
    source = make_source(root / "src")
    build_package(source, root / "version")
    shutil.copytree(root / "version", root / "bad-manifest")
    (root / "bad-manifest" / "manifest.json").write_bytes(b"\xff{}")
    shutil.copytree(source, root / "bad-spec")
    (root / "bad-spec" / "package.yaml").write_bytes(b"model_id: \xff\n")
    (root / "bad-pins.txt").write_bytes(b"numpy==\xff\n")
    return root


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("package inspect {root}/bad-manifest", "manifest.json is not UTF-8"),
        ("package verify {root}/bad-manifest", "manifest.json is not UTF-8"),
        (
            "publish {root}/bad-manifest --bucket b --dry-run --endpoint-url http://127.0.0.1:1",
            "manifest.json is not UTF-8",
        ),
        ("package build {root}/bad-spec --out {root}/o1", "package.yaml is not UTF-8"),
        (
            "package build {root}/src --out {root}/o2 --constraints {root}/bad-pins.txt",
            "bad-pins.txt is not UTF-8",
        ),
        (
            "publish {root}/version --bucket b --region bad_region",
            "cannot create the S3 client: Provided region_name 'bad_region'",
        ),
        (
            "publish {root}/version --bucket b --endpoint-url notaurl",
            "cannot create the S3 client: Invalid endpoint: notaurl",
        ),
    ],
)
def test_user_error_is_one_line(trees: Path, command: str, expected: str) -> None:
    result = runner.invoke(app, command.replace("{root}", str(trees)).split())
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert expected in lines[0]
