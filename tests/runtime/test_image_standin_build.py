"""images/serving/Dockerfile built for real with buildah, FROM the stand-in of the NGC base
image (tests/support/triton_base.py), and the built image's own ENTRYPOINT run on a package.

The build runs every line of the Dockerfile as written: apt, the builder's wheel, the install
under the pair's pins and the base's freeze, ``image-constraints``. The run goes through all
eight stages with the real vLLM's import probe, serves a request on the public port, and drains
on SIGTERM.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from runtime.compat import load_matrix
from runtime.package import build_package
from tests.runtime.pod import http_status, infer, port_refuses
from tests.runtime.wheelmaker import make_source, make_toy_plugin
from tests.support.ports import free_port
from tests.support.triton_base import Buildah, build_base

ROOT = Path(__file__).resolve().parents[2]
TAG = "localhost/llm-serving:standin-test"
CACHE = "/mnt/model-cache/package"

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def buildah(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Buildah]:
    tool = Buildah(tmp_path_factory.mktemp("buildah"))
    yield tool
    subprocess.run(tool.argv("rm", "--all"), env=tool.env(), capture_output=True, check=False)
    shutil.rmtree(tool.root, ignore_errors=True)  # the vfs store holds several GB


@pytest.fixture(scope="module")
def image(buildah: Buildah, tmp_path_factory: pytest.TempPathFactory) -> str:
    pair = load_matrix().default
    build_base(buildah, pair, tmp_path_factory.mktemp("base"))
    # Docker's format keeps SHELL, which the OCI format drops; `docker build` writes it too.
    buildah("bud", "--pull=never", "--format", "docker", "--network", "host",
            "--build-arg", f"TRITON_RELEASE={pair.triton}",
            "-f", str(ROOT / "images/serving/Dockerfile"), "-t", TAG, str(ROOT))  # fmt: skip
    return TAG


def _run_args(
    buildah: Buildah, package: Path, env: dict[str, str], container: str | None = None
) -> list[str]:
    """``buildah run`` of the image's Entrypoint in ``container`` (a new one by default)."""
    container = container or buildah("from", "--pull=never", TAG).strip()
    entrypoint = buildah.inspect(TAG)["config"]["Entrypoint"]
    flags = [f"--env={k}={v}" for k, v in env.items()]
    return buildah.argv(
        "run", "--network", "host", "-v", f"{package}:{CACHE}:ro", *flags, container, "--",
        *entrypoint,
    )  # fmt: skip


def _ports() -> dict[str, str]:
    names = ("PUBLIC_GRPC", "HEALTH", "TRITON_HTTP", "TRITON_METRICS")
    return {f"LLM_SERVING_{name}_PORT": str(free_port()) for name in names}


def _entrypoint(process: subprocess.Popen[str]) -> psutil.Process:
    """The image's entrypoint process under ``buildah run`` (which does not forward SIGTERM)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        for child in psutil.Process(process.pid).children(recursive=True):
            try:
                argv = child.cmdline()
            # NoSuchProcess includes zombies: buildah's short-lived helpers; a helper that
            # changed user on its way into the container may refuse to be read.
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if "runtime.entrypoint" in argv and "python3" in argv[0]:
                return child
        time.sleep(0.1)
    raise AssertionError("the image's entrypoint never started")


def test_image_holds_the_entrypoint_and_the_pins(image: str, buildah: Buildah) -> None:
    config = buildah.inspect(image)["config"]
    assert config["Entrypoint"] == [
        "/opt/nvidia/nvidia_entrypoint.sh", "python3", "-m", "runtime.entrypoint"
    ]  # fmt: skip
    env = dict(line.split("=", 1) for line in config["Env"])
    assert env["PIP_CONSTRAINT"] == "/etc/llm-serving/constraints.txt"
    assert env["LLM_SERVING_TRITON_RELEASE"] == load_matrix().default.triton
    assert {"8001/tcp", "8080/tcp", "8081/tcp"} <= set(config["ExposedPorts"])
    container = buildah("from", "--pull=never", image).strip()
    pins = buildah("run", container, "--", "cat", "/etc/llm-serving/constraints.txt")
    lines = pins.splitlines()
    assert "vllm==0.27.1" in lines and "torch==2.13.0" in lines
    # Every distribution of the image is pinned, the runtime's own dependencies included.
    names = {line.partition("==")[0] for line in lines if "==" in line}
    assert {"llm-serving", "fastapi", "tritonclient", "grpcio"} <= names


def test_image_serves_a_package_and_drains_on_sigterm(
    image: str, buildah: Buildah, tmp_path: Path
) -> None:
    build_package(make_source(tmp_path / "src"), tmp_path / "version")
    env = _ports() | {"LLM_SERVING_PACKAGE_PATH": CACHE, "LLM_SERVING_READY_TIMEOUT_SECONDS": "120"}
    public, health = int(env["LLM_SERVING_PUBLIC_GRPC_PORT"]), int(env["LLM_SERVING_HEALTH_PORT"])
    process = subprocess.Popen(
        _run_args(buildah, tmp_path / "version", env),
        stderr=subprocess.PIPE,
        text=True,
        env=buildah.env(),
    )
    try:
        entrypoint = _entrypoint(process)
        # Stages 3 and 5 take seconds: the gate cannot have opened yet.
        assert port_refuses(public), "the public port answered before the model was ready"
        deadline = time.monotonic() + 240
        while http_status(health, "/readyz") != 200:
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "the image's entrypoint was not ready in time"
            time.sleep(0.2)
        assert infer(public, "the quick brown fox", max_tokens=4)
        entrypoint.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert "stage 5/8 compat done" in err and "stage 8/8 gate done" in err, err
    assert process.returncode == 0, err
    assert port_refuses(public)


def test_image_refuses_a_plugin_that_moves_vllm(
    image: str, buildah: Buildah, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make_source(tmp_path / "src")
    make_toy_plugin(source / "plugins", "vllm>=0.30")
    # Packaged as a builder without the pin check would have: the image must still refuse it.
    monkeypatch.setattr("runtime.package.build.check_against_pins", lambda *a: None)
    build_package(source, tmp_path / "version")
    env = _ports() | {"LLM_SERVING_PACKAGE_PATH": CACHE, "LLM_SERVING_READY_TIMEOUT_SECONDS": "60"}
    done = subprocess.run(
        _run_args(buildah, tmp_path / "version", env),
        capture_output=True,
        text=True,
        timeout=300,
        env=buildah.env(),
    )
    # buildah run exits non-zero; the stage line says which stage (exit 13 inside).
    assert done.returncode != 0 and "stage 3/8 plugins failed" in done.stderr, done.stderr
    assert "plugin toy-plugin requires 'vllm>=0.30' but vllm is 0.27.1" in done.stderr, done.stderr


# Removes one of vLLM's requirements that the stand-in holds as bare metadata (not a pin).
_DROP_A_VLLM_REQUIREMENT = """
import pathlib, shutil, sysconfig
site = pathlib.Path(sysconfig.get_paths()["purelib"])
bare = sorted(d for d in site.glob("*.dist-info") if not (d / "RECORD").exists())
drop = next(d for d in bare if not d.name.startswith(("torchaudio-", "torchvision-")))
shutil.rmtree(drop)
print(drop.name.partition("-")[0])
"""


def test_image_installs_plugins_on_a_base_that_misses_a_vllm_requirement(
    image: str, buildah: Buildah, tmp_path: Path
) -> None:
    # A base image need not meet every requirement of its own vLLM; stage 3 checks what the
    # plugins require, not the whole environment.
    container = buildah("from", "--pull=never", image).strip()
    dropped = buildah("run", container, "--", "python3", "-c", _DROP_A_VLLM_REQUIREMENT).strip()
    check = subprocess.run(
        buildah.argv("run", container, "--", "python3", "-m", "pip", "check"),
        capture_output=True, text=True, env=buildah.env(), check=False,
    )  # fmt: skip
    assert check.returncode != 0 and "vllm 0.27.1 requires" in check.stdout, check.stdout
    build_package(make_source(tmp_path / "src"), tmp_path / "version")
    env = _ports() | {"LLM_SERVING_PACKAGE_PATH": CACHE}
    process = subprocess.Popen(
        _run_args(buildah, tmp_path / "version", env, container),
        stderr=subprocess.PIPE,
        text=True,
        env=buildah.env(),
    )
    seen = []
    try:
        entrypoint = _entrypoint(process)
        assert process.stderr is not None
        for line in process.stderr:
            seen.append(line)
            if "stage 3/8 plugins" in line:
                break
        entrypoint.send_signal(signal.SIGTERM)  # before the gate opens: the start is cancelled
        seen.append(process.communicate(timeout=120)[1])
    finally:
        if process.poll() is None:
            process.kill()
    err = "".join(seen)
    assert "stage 3/8 plugins done" in err, f"{dropped} missing:\n{err}"
    assert process.returncode == 0, err
