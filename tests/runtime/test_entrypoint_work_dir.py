"""The work dir (an emptyDir that outlives container restarts) as the pod finds it: what an
interrupted start left there, and a disk that cannot take the package, which the failure line
blames, not the package."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from operations.publish import publish
from runtime.entrypoint.errors import StageFailed
from runtime.entrypoint.stages import unpack
from runtime.package import MANIFEST_NAME, load_manifest
from runtime.package import unpack as package_unpack
from tests.runtime.pod import Pod
from tests.runtime.test_entrypoint_failures import failure_line


def test_a_download_a_restart_cut_short_is_started_afresh(
    tmp_path: Path, s3_env: dict[str, str], s3_client: Any, bucket: str
) -> None:
    """s3transfer writes each file as ``<name>.<8 random characters>`` and renames it once
    complete: a container killed mid-download leaves that file, which is no weight file."""
    pod = Pod.create(tmp_path)
    publish(s3_client, pod.root / "version", bucket)
    pod.env.update(s3_env)
    pod.env["LLM_SERVING_PACKAGE_PATH"] = str(tmp_path / "not-restored")
    pod.env["LLM_SERVING_PACKAGE_S3_URI"] = f"s3://{bucket}/models/toy/v1/"
    weights = tmp_path / "work" / "download" / "weights"
    weights.mkdir(parents=True)
    (weights / "model.safetensors.3fA9b2C1").write_bytes(b"\0" * 100)
    pod.start().wait_ready()
    code, err = pod.terminate()
    assert code == 0, err


def test_a_work_dir_that_cannot_be_written_is_named_as_the_fix(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    (tmp_path / "work").write_text("not a folder")  # as a read-only root file system would
    code, err = pod.run_to_exit()
    assert code == 12, err
    line = failure_line(err)
    assert "stage 2/8 unpack failed: cannot prepare the unpack folder" in line
    assert "fix: mount a writable emptyDir at LLM_SERVING_WORK_DIR" in line
    assert "republish" not in line


def test_a_full_work_dir_is_named_as_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = Pod.create(tmp_path)
    version = pod.root / "version"
    manifest = load_manifest(version / MANIFEST_NAME)

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(package_unpack, "_copy_range", full)
    with pytest.raises(StageFailed) as failed:
        unpack(version, manifest, tmp_path / "package", 1 << 30)
    size = sum(entry.size for entry in manifest.archive_files)
    assert "No space left on device" in str(failed.value)
    assert failed.value.fix == (
        f"mount a writable emptyDir at LLM_SERVING_WORK_DIR with room for the package "
        f"({size} bytes unpacked)"
    )
