"""A package file that disappears or becomes unreadable after publish planned (against moto's S3
server over HTTP): one line naming the file and what to do, never a traceback, the manifest not
written, and what was uploaded kept for the next run to resume."""

from __future__ import annotations

import errno
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import operations.publish.upload as upload_module
from operations.cli import app
from operations.publish import PlanItem, PublishError, PublishPlan, publish
from tests.runtime.interrupted_publish import PART
from tests.runtime.wheelmaker import build_multipart_version

PREFIX = "models/toy/v1/"
WEIGHTS = "weights/model.safetensors"


def keys(client: Any, bucket: str) -> set[str]:
    response = client.list_objects_v2(Bucket=bucket)
    return {o["Key"] for o in response.get("Contents", [])}


def removed(path: Path) -> None:
    path.unlink()


def made_a_directory(path: Path) -> None:
    # Unreadable even for root, which a chmod 000 is not.
    path.unlink()
    path.mkdir()


@pytest.fixture
def version(tmp_path: Path) -> Path:
    return build_multipart_version(tmp_path)


def _damage_after_planning(
    monkeypatch: pytest.MonkeyPatch, path: Path, damage: Callable[[Path], None]
) -> None:
    """Plan as publish does, then ``damage`` ``path``: as a rebuild or a clean-up of the version
    folder would between the plan (printed, or run with --dry-run first) and the upload."""
    plan_publish = upload_module.plan_publish

    def plan_then_damage(*args: Any, **kwargs: Any) -> PublishPlan:
        plan = plan_publish(*args, **kwargs)
        damage(path)
        return plan

    monkeypatch.setattr(upload_module, "plan_publish", plan_then_damage)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [(removed, "No such file or directory"), (made_a_directory, "Is a directory")],
    ids=["removed", "a-directory"],
)
def test_a_file_unreadable_after_planning_is_one_line_and_nothing_is_uploaded(
    s3_client: Any,
    bucket: str,
    version: Path,
    monkeypatch: pytest.MonkeyPatch,
    damage: Callable[[Path], None],
    reason: str,
) -> None:
    path = version / WEIGHTS
    _damage_after_planning(monkeypatch, path, damage)
    with pytest.raises(PublishError) as err:
        publish(s3_client, version, bucket, part_size=PART)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"cannot read {path}: {reason}")
    assert "nothing was uploaded and the manifest was not written" in message
    assert "rebuild the package (llm-serving package build)" in message
    assert "run publish again" in message
    assert keys(s3_client, bucket) == set()
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_cli_reports_a_file_gone_after_planning_in_one_line(
    s3_env: dict[str, str],
    s3_client: Any,
    bucket: str,
    version: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = version / WEIGHTS
    _damage_after_planning(monkeypatch, path, removed)
    result = CliRunner().invoke(app, ["publish", str(version), "--bucket", bucket])
    assert result.exit_code == 1, result.output
    assert not isinstance(result.exception, OSError)
    # Only the last line: moto's own request log can land in the captured output too.
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot read {path}: No such file or directory")
    assert "rebuild the package" in last
    assert keys(s3_client, bucket) == set()


class _FailingRead(io.BufferedReader):
    """A file whose reads fail (EIO, as a disk or network file system going away would) once
    ``good`` bytes have been read."""

    def __init__(self, raw: Any, good: int) -> None:
        super().__init__(raw)
        self._left = good

    def read(self, size: int | None = -1, /) -> bytes:
        if self._left <= 0:
            raise OSError(errno.EIO, "Input/output error")
        data = super().read(size)
        self._left -= len(data)
        return data


def _read_fails_after(monkeypatch: pytest.MonkeyPatch, path: Path, good: int) -> None:
    """Reads of ``path`` opened after its check (which hashes the whole file), as the upload
    does, fail once ``good`` bytes were read."""
    check_local = upload_module._check_local
    checked: list[str] = []

    def check_then_break(folder: Path, entry: Any) -> None:
        check_local(folder, entry)
        if folder / entry.path == path:
            checked.append(entry.path)

    real_open = Path.open

    def open_failing(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if self == path and mode == "rb" and checked:
            return _FailingRead(io.FileIO(self, "rb"), good)
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(upload_module, "_check_local", check_then_break)
    monkeypatch.setattr(Path, "open", open_failing)


def test_a_read_failing_mid_upload_is_one_line_and_the_upload_resumes(
    s3_client: Any, bucket: str, version: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = version / WEIGHTS
    with monkeypatch.context() as patched:
        _read_fails_after(patched, path, PART)
        with pytest.raises(PublishError) as err:
            publish(s3_client, version, bucket, part_size=PART, workers=1)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"cannot read {path} while uploading it: Input/output error")
    assert "the manifest was not written" in message
    assert "what was uploaded is kept" in message
    assert "rebuild the package (llm-serving package build)" in message
    assert "run publish again" in message
    found = keys(s3_client, bucket)
    assert PREFIX + "manifest.json" not in found
    assert PREFIX + WEIGHTS not in found  # never completed from a partial read
    (upload,) = s3_client.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert PREFIX + ".publish/" + WEIGHTS + ".json" in found  # its record, for the resume

    sent: list[str] = []
    plan = publish(_RecordingParts(s3_client, sent), version, bucket, part_size=PART, workers=1)
    item: PlanItem = {i.key: i for i in plan.items}[PREFIX + WEIGHTS]
    assert (item.action, item.upload_id) == ("resume", upload["UploadId"])
    assert sent == ["2", "3"]  # the part read before the failure was kept
    body = s3_client.get_object(Bucket=bucket, Key=PREFIX + WEIGHTS)["Body"].read()
    assert body == path.read_bytes()
    assert PREFIX + "manifest.json" in keys(s3_client, bucket)


def test_a_small_file_gone_before_its_put_is_one_line(
    s3_client: Any, bucket: str, version: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = version / "weights" / "config.json"
    check_local = upload_module._check_local

    def check_then_remove(folder: Path, entry: Any) -> None:
        check_local(folder, entry)
        if entry.path == "weights/config.json":
            path.unlink()

    monkeypatch.setattr(upload_module, "_check_local", check_then_remove)
    with pytest.raises(PublishError) as err:
        publish(s3_client, version, bucket, part_size=PART)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"cannot read {path} while uploading it: No such file or directory")
    assert "rebuild the package (llm-serving package build)" in message
    assert PREFIX + "manifest.json" not in keys(s3_client, bucket)


class _RecordingParts:
    """Passes every call to the real client and notes the part numbers sent."""

    def __init__(self, client: Any, sent: list[str]) -> None:
        self._client, self._sent = client, sent

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name != "upload_part":
            return attr

        def upload_part(**kwargs: Any) -> Any:
            self._sent.append(str(kwargs["PartNumber"]))
            return attr(**kwargs)

        return upload_part
