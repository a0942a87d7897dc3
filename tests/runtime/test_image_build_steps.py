"""The serving image's own build steps, replayed without Docker on exactly what it copies.

There is no Docker engine and no NGC base image on these machines, so the image itself is never
built here. What does not need the base image is replayed for real: the builder stage's
``pip wheel`` on a context holding only the files its COPY lines name (minus
``.dockerignore``), and the serving stage's install of that wheel under the pinned constraints
into a fresh virtualenv, which must then work without the source tree.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.support.dockerfile import Stage, dockerfile_stages
from tests.support.triton_base import write_bare_distributions

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "images" / "serving" / "Dockerfile"
CONSTRAINTS = ROOT / "images" / "serving" / "constraints.txt"

NATIVE_MODULES = ("runtime/constraints/_engine",)
#: What the image runs or reads beside ``runtime``: every tracked file must be in the wheel.
SHIPPED_PACKAGES = ("runtime", "contracts", "operations")

pytestmark = pytest.mark.timeout(900)


def dockerignore_patterns() -> list[str]:
    return [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule, for the patterns used here: a match on the path or a folder above it."""
    parts = rel.split("/")
    for pattern in patterns:
        # "**/x" matches x at any depth; a plain pattern is anchored at the context root.
        starts = range(len(parts)) if pattern.startswith("**/") else range(1)
        bare = pattern.removeprefix("**/")
        for i in starts:
            if any(
                fnmatch.fnmatchcase("/".join(parts[i:j]), bare)
                for j in range(i + 1, len(parts) + 1)
            ):
                return True
    return False


def build_context(stage: Stage, dest: Path) -> list[str]:
    """Copy what the stage's local COPY lines name into ``dest`` (its WORKDIR); return them."""
    patterns = dockerignore_patterns()
    copied: list[str] = []
    for args in stage.args("COPY"):
        *sources, target = shlex.split(args)
        assert not any(s.startswith("--") for s in sources), f"COPY {args}: no flags expected"
        for source in sources:
            src = ROOT / source
            assert src.exists(), f"the Dockerfile copies {source}, which does not exist"
            files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
            for path in files:
                rel = path.relative_to(ROOT).as_posix()
                if _ignored(rel, patterns):
                    continue
                inner = path.relative_to(src) if src.is_dir() else Path(path.name)
                into = dest / target
                out = into / inner if src.is_dir() or target.endswith("/") else into
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, out)
                copied.append(rel)
    return copied


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would point Python at the source tree or the dev venv."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_CONSTRAINT")
    env = {
        k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("LLM_SERVING_")
    }
    return {**env, **extra}


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return dockerfile_stages(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def built_wheel(stages: dict[str, Stage], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builder stage's wheel, built by its own ``pip wheel`` line from its COPY set."""
    context = tmp_path_factory.mktemp("builder") / "src"
    build_context(stages["builder"], context)
    (command,) = [run for run in stages["builder"].args("RUN") if " pip wheel " in run]
    words = shlex.split(command)
    pip_args = words[words.index("pip") + 1 :]
    wheels = Path(pip_args[pip_args.index("--wheel-dir") + 1])
    out = tmp_path_factory.mktemp("wheels")
    pip_args[pip_args.index("--wheel-dir") + 1] = str(out)
    # The image builds without a cache; here the pip cache keeps the build requirements local.
    pip_args = [a for a in pip_args if a != "--no-cache-dir"]
    assert pip_args[-1] == ".", f"the builder builds its WORKDIR, not {pip_args[-1]}"
    assert wheels.is_absolute()
    done = subprocess.run(
        [sys.executable, "-m", "pip", *pip_args],
        cwd=context,
        capture_output=True,
        text=True,
        env=_clean_env(),
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (wheel,) = out.glob("llm_serving-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel installed under the image's pins; its python."""
    root = tmp_path_factory.mktemp("image-venv")
    venv.EnvBuilder(with_pip=True).create(root)
    python = root / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(built_wheel)],
        capture_output=True,
        text=True,
        env=_clean_env(PIP_CONSTRAINT=str(CONSTRAINTS)),
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return python


def test_dockerfile_parser_reads_the_stages(stages: dict[str, Stage]) -> None:
    assert list(stages) == ["builder", "1"]
    assert any(" pip wheel " in run for run in stages["builder"].args("RUN"))
    assert stages["1"].args("ENTRYPOINT") == [
        '["/opt/nvidia/nvidia_entrypoint.sh", "python3", "-m", "runtime.entrypoint"]'
    ]


@pytest.mark.parametrize(
    ("path", "ignored"),
    [
        ("runtime/__init__.py", False),
        ("csrc/src/constraint.cc", False),
        ("runtime/__pycache__/cli.cpython-311.pyc", True),
        ("runtime/constraints/_engine.cpython-311-x86_64-linux-gnu.so", True),
        (".venv/lib/python3.11/site-packages/x.py", True),
        ("build/cp311-cp311-linux_x86_64/CMakeCache.txt", True),
    ],
)
def test_dockerignore_keeps_local_builds_out(path: str, ignored: bool) -> None:
    assert _ignored(path, dockerignore_patterns()) is ignored


def test_builder_context_is_the_sources(tmp_path: Path, stages: dict[str, Stage]) -> None:
    copied = build_context(stages["builder"], tmp_path)
    assert "runtime/__init__.py" in copied and "csrc/CMakeLists.txt" in copied
    assert (tmp_path / "pyproject.toml").is_file() and (tmp_path / "images/compat.toml").is_file()
    assert (tmp_path / "images/vllm-requirements.toml").is_file()
    assert not any("__pycache__" in p or p.endswith(".so") for p in copied)


def test_wheel_holds_the_native_modules_and_every_runtime_file(built_wheel: Path) -> None:
    names = set(zipfile.ZipFile(built_wheel).namelist())
    for module in NATIVE_MODULES:
        assert any(n.startswith(module) and n.endswith(".so") for n in names), module
    assert {"runtime/compat.toml", "runtime/vllm-requirements.toml"} <= names
    # Site-packages' own .pth: puts LLM_SERVING_PLUGIN_DIR on the path of Triton's isolated stub.
    assert "llm_serving_plugin_dir.pth" in names
    tracked = subprocess.run(
        ["git", "ls-files", *SHIPPED_PACKAGES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    missing = [p for p in tracked if (ROOT / p).exists() and p not in names]
    assert not missing, f"files the runtime ships but the wheel lacks: {missing}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(built_wheel).read(entry_points).decode()
    assert "runtime.constraints.plugin:ConstraintProcessorEntryPoint" in text


def test_installed_wheel_works_without_the_source_tree(installed: Path, tmp_path: Path) -> None:
    natives = ", ".join(m.replace("/", ".") for m in NATIVE_MODULES)
    probe = (
        f"import importlib.metadata as m, runtime, runtime.compat as c, {natives}; "
        "print(runtime.__file__); "
        "print(sorted(e.value for e in m.entry_points(group='vllm.logits_processors'))); "
        "print(len(c.vllm_requirements(c.load_matrix().default.vllm)))"
    )
    done = subprocess.run(
        [str(installed), "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=_clean_env(),
    )
    assert done.returncode == 0, done.stderr
    where, plugins, requirements = done.stdout.splitlines()
    assert int(requirements) > 50  # vllm-requirements.toml travelled inside the wheel
    assert Path(where).is_relative_to(installed.parent.parent), where
    assert plugins == "['runtime.constraints.plugin:ConstraintProcessorEntryPoint']"
    pins = subprocess.run(
        [str(installed), "-m", "runtime.compat", "constraints"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=_clean_env(),
    )
    assert pins.returncode == 0, pins.stderr
    assert pins.stdout == CONSTRAINTS.read_text()  # compat.toml travelled inside the wheel


def test_installed_entrypoint_fails_its_first_stage_in_one_line(
    installed: Path, tmp_path: Path
) -> None:
    env = _clean_env(
        LLM_SERVING_MODEL_CACHE_ROOT=str(tmp_path / "empty-cache"),
        LLM_SERVING_MODEL_ID="absent",
        LLM_SERVING_MODEL_VERSION="1",
        LLM_SERVING_WORK_DIR=str(tmp_path / "work"),
    )
    done = subprocess.run(
        [str(installed), "-m", "runtime.entrypoint"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 11, done.stderr
    assert "locate" in done.stderr


IMAGE_PINS = {
    "vllm": "0.27.1+9114fd76",  # NGC builds carry a local label
    "torch": "2.13.0+cu130",
    "torchaudio": "2.11.0",
    "torchvision": "0.28.0",
}


@pytest.mark.parametrize(
    ("changed", "release", "error"),
    [
        ({}, "26.08", None),
        ({"torch": "2.12.0"}, "26.08", "torch 2.12.0"),
        ({"vllm": "0.24.0"}, "26.08", "installed vllm 0.24.0"),
        ({}, "26.07", "not the one of Triton 26.07"),
    ],
    ids=["the-pair", "other-torch", "other-vllm", "other-release"],
)
def test_installed_image_constraints_check_the_base_and_pin_everything(
    installed: Path, tmp_path: Path, changed: dict[str, str], release: str, error: str | None
) -> None:
    site = write_bare_distributions(tmp_path / "base", IMAGE_PINS | changed)
    done = subprocess.run(
        [str(installed), "-m", "runtime.compat", "image-constraints", "--triton", release,
         "--pair-file", str(CONSTRAINTS)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=_clean_env(PYTHONPATH=str(site)),
    )  # fmt: skip
    if error is not None:
        assert done.returncode == 1 and error in done.stderr, done.stderr
        assert done.stdout == ""
        return
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(CONSTRAINTS.read_text())
    pins = [line for line in done.stdout.splitlines() if line and not line.startswith("#")]
    names = [line.partition("==")[0] for line in pins]
    assert len(names) == len(set(names)), "one pin per distribution"
    # Everything the image holds is pinned, the runtime's own dependencies included.
    assert {"llm-serving", "pydantic", "protobuf", "tritonclient"} <= set(names)
    # The pair's pins stay as the pair spells them; the rest as installed.
    assert "torch==2.13.0" in pins and "vllm==0.27.1" in pins


def _replay(command: str, paths: dict[str, Path], python: Path) -> str:
    """A RUN line of the serving stage with its absolute paths moved under the test's folders
    and ``python3`` as the given interpreter, to run as it is."""
    for image_path, local in sorted(paths.items(), key=lambda kv: -len(kv[0])):
        command = command.replace(image_path, str(local))
    return command.replace("python3 -m ", f"{python} -m ")


#: NGC's vLLM image, which Triton's vllm-python-py3 image is built from, ships NVIDIA's own
#: torch build (NGC vLLM release notes: ``2.12.0a0+5aff3928d8`` in 26.05).
NGC_BUILDS = {
    "torch": "2.13.0a0+5aff3928d8",
    "torchaudio": "2.11.0a0+5aff3928d8",
    "torchvision": "0.28.0a0+5aff3928d8",
}


@pytest.mark.parametrize(
    ("changed", "error"),
    [({}, None), (NGC_BUILDS, None), ({"torch": "2.12.0"}, "torch 2.12.0")],
    ids=["the-pair", "nvidia-builds", "other-torch"],
)
def test_serving_stage_install_line_runs_as_written(
    stages: dict[str, Stage],
    installed: Path,
    built_wheel: Path,
    tmp_path: Path,
    changed: dict[str, str],
    error: str | None,
) -> None:
    # The serving stage's own RUN line (freeze, install under the pair and the freeze, check,
    # write the constraints) on a stand-in for the base image: the wheel's venv plus the
    # base's pinned distributions as metadata.
    stage = stages["1"]
    (copy,) = [a for a in stage.args("COPY") if a.startswith("images/serving/constraints.txt")]
    pair_file = copy.split()[1]
    (run,) = [r for r in stage.args("RUN") if "runtime.compat image-constraints" in r]
    etc, wheels = tmp_path / "etc", tmp_path / "wheels"
    etc.mkdir()
    wheels.mkdir()
    shutil.copy2(built_wheel, wheels)
    paths = {
        "/etc/llm-serving": etc,
        "/tmp/wheels": wheels,
        "/tmp/base-freeze.txt": tmp_path / "base-freeze.txt",
        "/var/run/llm-serving": tmp_path / "var",
    }
    shutil.copy2(CONSTRAINTS, _replay(pair_file, paths, installed))
    site = write_bare_distributions(tmp_path / "base", IMAGE_PINS | changed)
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", _replay(run, paths, installed)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=_clean_env(PYTHONPATH=str(site), TRITON_RELEASE="26.08"),
        timeout=300,
    )
    if error is not None:
        assert done.returncode != 0 and error in done.stderr, done.stderr[-2000:]
        return
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    written = (etc / "constraints.txt").read_text()
    lines = written.splitlines()
    # The pair's pins as the pair spells them, or the base's own builds standing in for them.
    assert all(f"{name}=={version}" in lines for name, version in changed.items())
    if not changed:
        assert written.startswith(CONSTRAINTS.read_text())
    assert "\nllm-serving==" in written and "\npydantic==" in written
    assert (tmp_path / "var" / "prometheus").is_dir() and not wheels.exists()
