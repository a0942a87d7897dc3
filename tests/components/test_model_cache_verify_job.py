"""The materialize Job loads and verifies the version: a serving-image container reads every file
of the version folder, several at once, and hashes it against manifest.json, so a weight file
with the right size but other bytes fails the Job before any server of the version starts
(stage 1 of the entrypoint checks only sizes on the cache)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from components.model_cache import CACHE_MOUNT_PATH, ModelCache, ModelCacheArgs
from runtime.package import build_package
from tests.components.declared import Declare, Declared
from tests.runtime.wheelmaker import make_source

VERSIONS = [("llama", "v1"), ("ranker", "2026.11")]


def _args() -> ModelCacheArgs:
    return ModelCacheArgs(
        vpc_id="vpc-1",
        subnet_id="subnet-1",
        node_security_group_id="sg-nodes",
        bucket_name="models-use1",
        namespace="serving",
        versions=VERSIONS,
        serving_image="serving:1",
        client_node_groups=["r-h100"],
        verify_jobs=4,
    )


@pytest.fixture
def declared(declare: Declare) -> Declared:
    return declare(lambda: ModelCache("cache", _args()))


def _pods(declared: Declared) -> dict[tuple[str, str], dict]:
    jobs = sorted(declared.of_type("kubernetes:batch/v1:Job"), key=lambda j: j.name)
    assert len(jobs) == len(VERSIONS)
    return {
        version: job.inputs["spec"]["template"]["spec"]
        for version, job in zip(VERSIONS, jobs, strict=True)
    }


def test_the_serving_image_verifies_the_version_read_only(declared: Declared) -> None:
    for (model_id, version), pod in _pods(declared).items():
        (verify,) = pod["containers"]
        assert verify["image"] == "serving:1"
        assert verify["command"] == [
            "python3",
            "-m",
            "runtime.cli",
            "package",
            "verify",
            "--jobs",
            "4",
            f"{CACHE_MOUNT_PATH}/models/{model_id}/{version}",
        ]
        assert "--quick" not in verify["command"]  # sha256, not sizes only
        assert verify["volumeMounts"] == [
            {"name": "model-cache", "mountPath": CACHE_MOUNT_PATH, "readOnly": True}
        ]
        assert "capabilities" not in verify["securityContext"]
        assert verify["resources"]["requests"]["cpu"] == "1"
        # A failed verification must fail the pod, not be retried in place.
        assert pod["restartPolicy"] == "Never"


def _cache_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A built package laid out as the cache mirrors ``s3://<bucket>/models/<id>/<version>/``."""
    root = tmp_path / "cache"
    folder = root / "models" / "toy" / "v1"
    folder.parent.mkdir(parents=True)
    build_package(make_source(tmp_path / "src"), folder)
    return root, folder


def _rendered_verify_argv(declare: Declare) -> list[str]:
    """The verify container's command as the Job for ``toy``/``v1`` renders it."""
    declared = declare(lambda: ModelCache("cache", replace(_args(), versions=[("toy", "v1")])))
    (job,) = declared.of_type("kubernetes:batch/v1:Job")
    (verify,) = job.inputs["spec"]["template"]["spec"]["containers"]
    assert verify["image"] == "serving:1"
    return list(verify["command"])


def _run_verify(argv: list[str], root: Path) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "python3"
    # This checkout's interpreter stands in for the serving image's python3, and the test's
    # cache root for the mount point; every other argument is the Job's own.
    args = [a.replace(CACHE_MOUNT_PATH, str(root), 1) for a in argv[1:]]
    assert args[-1] == f"{root}/models/toy/v1"
    return subprocess.run(
        [sys.executable, *args],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_verify_command_accepts_an_intact_version(tmp_path: Path, declare: Declare) -> None:
    root, _ = _cache_folder(tmp_path)
    done = _run_verify(_rendered_verify_argv(declare), root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: toy/v1" in done.stdout


def test_verify_command_refuses_same_size_other_bytes(tmp_path: Path, declare: Declare) -> None:
    root, folder = _cache_folder(tmp_path)
    weights = folder / "weights" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0xFF
    weights.unlink()  # the build may hard-link the source's file
    weights.write_bytes(bytes(data))
    done = _run_verify(_rendered_verify_argv(declare), root)
    assert done.returncode != 0
    assert "checksum mismatch for weights/model.safetensors" in done.stderr
