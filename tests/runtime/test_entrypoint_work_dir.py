"""The work dir (an emptyDir that outlives container restarts) as the pod finds it: what an
interrupted start left there, and a disk that cannot take the package, which the failure line
blames, not the package."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from s3transfer.utils import OSUtils

from operations.publish import publish
from runtime.entrypoint.errors import StageFailed
from runtime.entrypoint.stages import download_version, unpack
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


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
def test_a_full_work_dir_is_named_as_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    pod = Pod.create(tmp_path)
    version = pod.root / "version"
    manifest = load_manifest(version / MANIFEST_NAME)

    def full(src_fd: int, member: object, target: Path, archive: Path) -> None:
        raise OSError(code, os.strerror(code), str(target))

    monkeypatch.setattr(package_unpack, "_copy_range", full)
    with pytest.raises(StageFailed) as failed:
        unpack(version, manifest, tmp_path / "package", 1 << 30)
    size = sum(entry.size for entry in manifest.archive_files)
    assert os.strerror(code) in str(failed.value)
    assert failed.value.fix == (
        f"mount a writable emptyDir at LLM_SERVING_WORK_DIR with room for the package "
        f"({size} bytes unpacked)"
    )


class _FullFile:
    """A file on a full disk: opens, then refuses every write as the kernel does."""

    def __init__(self, filename: str, code: int) -> None:
        self.name, self._code = filename, code

    def write(self, data: bytes) -> int:
        raise OSError(self._code, os.strerror(self._code))

    def seek(self, offset: int, whence: int = 0) -> int:
        return offset

    def tell(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def __enter__(self) -> _FullFile:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.mark.parametrize(
    ("code", "at_open"),
    [
        (errno.ENOSPC, False),  # the write runs out of room
        (errno.EDQUOT, False),
        (errno.EROFS, True),  # the file cannot even be created
        (errno.EACCES, True),
    ],
)
@pytest.mark.parametrize("fails", [MANIFEST_NAME, "weights/model.safetensors"])
def test_a_download_into_a_full_or_read_only_work_dir_names_it_not_s3(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    s3_env: dict[str, str],
    s3_client: Any,
    bucket: str,
    code: int,
    at_open: bool,
    fails: str,
) -> None:
    """The disk fails where s3transfer opens or writes its temporary file: the failure names
    the download folder and the room the package takes there (once the manifest says it)."""
    pod = Pod.create(tmp_path)
    publish(s3_client, pod.root / "version", bucket)
    manifest = load_manifest(pod.root / "version" / MANIFEST_NAME)
    target = tmp_path / "work" / "download"
    real_open = OSUtils.open

    def disk(self: OSUtils, filename: str, mode: str) -> Any:
        if "w" not in mode or not filename.startswith(str(target / fails)):
            return real_open(self, filename, mode)
        if at_open:
            raise OSError(code, os.strerror(code), filename)
        return _FullFile(filename, code)

    monkeypatch.setattr(OSUtils, "open", disk)
    with pytest.raises(StageFailed) as failed:
        download_version(f"s3://{bucket}/models/toy/v1/", target)
    assert str(failed.value) == f"cannot write the download folder {target}: {os.strerror(code)}"
    room = ""
    if fails != MANIFEST_NAME:  # by then the manifest has told the sizes
        downloaded = manifest.archive.size + sum(entry.size for entry in manifest.weight_files)
        unpacked = sum(entry.size for entry in manifest.archive_files)
        room = f" ({downloaded} bytes downloaded, then {unpacked} bytes unpacked)"
    assert failed.value.fix == (
        f"mount a writable emptyDir at LLM_SERVING_WORK_DIR with room for the package{room}"
    )


def test_a_permission_denied_outside_the_download_folder_is_still_s3s(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    s3_env: dict[str, str],
    s3_client: Any,
    bucket: str,
) -> None:
    """EACCES names the disk only for a file in the download folder: an unreadable web
    identity token file (read lazily, during the first request) is the pod's S3 access."""
    pod = Pod.create(tmp_path)
    publish(s3_client, pod.root / "version", bucket)
    token = "/var/run/secrets/eks.amazonaws.com/serviceaccount/token"

    def unreadable(self: OSUtils, filename: str, mode: str) -> Any:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), token)

    monkeypatch.setattr(OSUtils, "open", unreadable)
    with pytest.raises(StageFailed) as failed:
        download_version(f"s3://{bucket}/models/toy/v1/", tmp_path / "download")
    assert str(failed.value).startswith(f"cannot download s3://{bucket}/models/toy/v1/: ")
    assert failed.value.fix == "check the bucket, the prefix and the pod's S3 permissions"


def test_a_missing_object_is_still_blamed_on_s3(
    tmp_path: Path, s3_env: dict[str, str], bucket: str
) -> None:
    with pytest.raises(StageFailed) as failed:
        download_version(f"s3://{bucket}/models/absent/v1/", tmp_path / "download")
    assert "Not Found" in str(failed.value) or "404" in str(failed.value)
    assert failed.value.fix == "check the bucket, the prefix and the pod's S3 permissions"
