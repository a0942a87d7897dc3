"""Publishing against moto's S3 server over HTTP: multipart, resume, skip, manifest last."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from operations.cli import app
from operations.publish import DEFAULT_PART_SIZE, PublishError, format_plan, part_layout, publish
from runtime.package import build_package
from tests.runtime.interrupted_publish import PART, publish_cut_after_first_part
from tests.runtime.wheelmaker import build_multipart_version, make_source

PREFIX = "models/toy/v1/"


class CountingClient:
    """Passes every call to the real client, counts uploads and notes the part numbers sent."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: dict[str, int] = {}
        self.parts: list[int] = []
        # publish's workers call in at once: an unlocked read-add-store can lose a count.
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name in ("put_object", "upload_part", "create_multipart_upload"):

            def counted(*args: Any, **kwargs: Any) -> Any:
                with self._lock:
                    self.calls[name] = self.calls.get(name, 0) + 1
                    if name == "upload_part":
                        self.parts.append(kwargs["PartNumber"])
                return attr(*args, **kwargs)

            return counted
        return attr


@pytest.fixture
def version(tmp_path: Path) -> Path:
    return build_multipart_version(tmp_path)


def keys(client: Any, bucket: str) -> set[str]:
    response = client.list_objects_v2(Bucket=bucket)
    return {o["Key"] for o in response.get("Contents", [])}


def test_publish_uploads_everything_and_manifest_last(
    s3_client: Any, bucket: str, version: Path
) -> None:
    sent: list[int] = []
    order: list[str] = []
    client = CountingClient(s3_client)
    real_put = client.__getattr__("put_object")

    def put(**kwargs: Any) -> Any:
        order.append(kwargs["Key"])
        return real_put(**kwargs)

    client.put_object = put  # type: ignore[method-assign]
    plan = publish(client, version, bucket, part_size=PART, progress=sent.append, workers=4)
    assert {i.action for i in plan.items} == {"upload"}
    assert order[-1] == PREFIX + "manifest.json"
    assert client.calls["upload_part"] == 3
    assert sum(sent) == plan.bytes_to_send
    assert keys(s3_client, bucket) == {
        PREFIX + p
        for p in (
            "manifest.json",
            "package.tar",
            "weights/model.safetensors",
            "weights/config.json",
        )
    }
    body = s3_client.get_object(Bucket=bucket, Key=PREFIX + "weights/model.safetensors")["Body"]
    assert body.read() == (version / "weights" / "model.safetensors").read_bytes()
    manifest = s3_client.get_object(Bucket=bucket, Key=PREFIX + "manifest.json")["Body"].read()
    assert json.loads(manifest)["model_id"] == "toy"


def test_second_publish_skips_files_with_the_same_checksum(
    s3_client: Any, bucket: str, version: Path
) -> None:
    publish(s3_client, version, bucket, part_size=PART)
    client = CountingClient(s3_client)
    plan = publish(client, version, bucket, part_size=PART)
    assert {i.action for i in plan.items} == {"skip"}
    assert client.calls == {"put_object": 1}  # the manifest, rewritten identically


def test_interrupted_upload_resumes_without_resending_parts(
    s3_client: Any, bucket: str, version: Path
) -> None:
    kept_parts = len(publish_cut_after_first_part(s3_client, version, bucket))
    assert PREFIX + "manifest.json" not in keys(s3_client, bucket)
    assert PREFIX + "weights/model.safetensors" not in keys(s3_client, bucket)
    assert 1 <= kept_parts < 3

    client = CountingClient(s3_client)
    resumed = publish(client, version, bucket, part_size=PART, workers=2)
    actions = {i.key: i.action for i in resumed.items}
    assert actions[PREFIX + "weights/model.safetensors"] == "resume"
    assert client.calls.get("create_multipart_upload", 0) == 0
    assert client.calls["upload_part"] == 3 - kept_parts  # parts already in S3 are kept
    body = s3_client.get_object(Bucket=bucket, Key=PREFIX + "weights/model.safetensors")["Body"]
    assert body.read() == (version / "weights" / "model.safetensors").read_bytes()
    assert PREFIX + "manifest.json" in keys(s3_client, bucket)


def test_local_checksum_mismatch_is_reported_and_nothing_is_visible(
    s3_client: Any, bucket: str, version: Path
) -> None:
    config = version / "weights" / "config.json"
    config.write_bytes(config.read_bytes().replace(b"Toy", b"Bad"))
    with pytest.raises(PublishError) as err:
        publish(s3_client, version, bucket, part_size=PART)
    assert "checksum mismatch for weights/config.json" in str(err.value)
    assert keys(s3_client, bucket) == set()


def test_remote_checksum_mismatch_after_upload_is_reported(
    s3_client: Any, bucket: str, version: Path
) -> None:
    class DroppingClient(CountingClient):
        """Loses the checksum metadata of one object, as a broken proxy or bucket policy would."""

        def __getattr__(self, name: str) -> Any:
            attr = super().__getattr__(name)
            if name != "put_object":
                return attr

            def put(**kwargs: Any) -> Any:
                if kwargs["Key"].endswith("config.json"):
                    kwargs["Metadata"] = {"sha256": "0" * 64}
                return attr(**kwargs)

            return put

    with pytest.raises(PublishError) as err:
        publish(DroppingClient(s3_client), version, bucket, part_size=PART)
    assert f"checksum mismatch for s3://{bucket}/{PREFIX}weights/config.json" in str(err.value)
    assert PREFIX + "manifest.json" not in keys(s3_client, bucket)
    # A clean run replaces the bad object and completes.
    plan = publish(s3_client, version, bucket, part_size=PART)
    assert {i.key: i.action for i in plan.items}[PREFIX + "weights/config.json"] == "replace"
    assert PREFIX + "manifest.json" in keys(s3_client, bucket)


def test_published_version_is_immutable(
    s3_client: Any, bucket: str, version: Path, tmp_path: Path
) -> None:
    publish(s3_client, version, bucket, part_size=PART)
    other = make_source(tmp_path / "src2", engine_args={"max_model_len": 256})
    build_package(other, tmp_path / "out2")
    with pytest.raises(PublishError, match=r"already published .* versions are immutable"):
        publish(s3_client, tmp_path / "out2", bucket)


def test_dry_run_prints_the_plan_and_uploads_nothing(
    s3_client: Any, bucket: str, version: Path
) -> None:
    plan = publish(s3_client, version, bucket, dry_run=True)
    text = format_plan(plan)
    assert keys(s3_client, bucket) == set()
    assert text.splitlines()[-2].startswith("manifest")
    assert f"s3://{bucket}/{PREFIX}weights/model.safetensors" in text


def test_cli_publish_dry_run_and_real(
    s3_env: dict[str, str], s3_client: Any, bucket: str, version: Path
) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["publish", str(version), "--bucket", bucket, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "upload" in result.output and "total to send" in result.output
    assert keys(s3_client, bucket) == set()
    result = runner.invoke(
        app, ["publish", str(version), "--bucket", bucket, "--part-size-mb", "5"]
    )
    assert result.exit_code == 0, result.output
    assert f"published s3://{bucket}/{PREFIX}manifest.json" in result.output
    assert PREFIX + "manifest.json" in keys(s3_client, bucket)


def test_cli_reports_a_missing_bucket_in_one_line(s3_env: dict[str, str], version: Path) -> None:
    result = CliRunner().invoke(app, ["publish", str(version), "--bucket", "no-such-bucket"])
    assert result.exit_code == 1
    # Only the last line: moto's own request log can land in the captured output too.
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: S3 refused or failed") and "bucket does not exist" in last


def test_cli_reports_a_missing_weight_file_before_uploading(
    s3_env: dict[str, str], s3_client: Any, bucket: str, version: Path
) -> None:
    (version / "weights" / "config.json").unlink()
    result = CliRunner().invoke(app, ["publish", str(version), "--bucket", bucket])
    assert result.exit_code == 1
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: weights/config.json is missing from ")
    assert "rebuild the package" in last
    assert not isinstance(result.exception, FileNotFoundError)
    assert keys(s3_client, bucket) == set()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        # A directory where the file should be: unreadable even for root (chmod is not).
        (lambda p: (p.unlink(), p.mkdir()), r"cannot read .*model\.safetensors: Is a directory"),
        (lambda p: p.write_bytes(b"short"), r"model\.safetensors is 5 bytes, the manifest says"),
    ],
    ids=["unreadable", "wrong-size"],
)
def test_unreadable_or_resized_file_fails_before_the_first_upload(
    s3_client: Any, bucket: str, version: Path, damage: Callable[[Path], object], message: str
) -> None:
    damage(version / "weights" / "model.safetensors")
    client = CountingClient(s3_client)
    with pytest.raises(PublishError, match=message):
        publish(client, version, bucket, part_size=PART)
    assert client.calls == {}
    assert keys(s3_client, bucket) == set()


def test_resume_after_a_rebuild_restarts_the_upload_in_the_same_run(
    s3_client: Any, bucket: str, version: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    weights = tmp_path / "src" / "weights" / "model.safetensors"
    old = weights.read_bytes()
    publish_cut_after_first_part(s3_client, version, bucket)
    # Same size and the same first part, so only the recorded sha256 tells the builds apart.
    new = old[:PART] + os.urandom(len(old) - PART)
    shutil.rmtree(version)
    weights.write_bytes(new)
    build_package(tmp_path / "src", version)

    client = CountingClient(s3_client)
    with caplog.at_level(logging.WARNING, logger="operations.publish"):
        plan = publish(client, version, bucket, part_size=PART, workers=2)
    item = {i.key: i for i in plan.items}[PREFIX + "weights/model.safetensors"]
    assert item.action == "restart"
    assert f"the file is now {hashlib.sha256(new).hexdigest()}" in item.reason
    assert f"aborting multipart upload {item.upload_id}" in caplog.text
    assert "starting a fresh one" in caplog.text
    assert client.calls["create_multipart_upload"] == 1
    assert sorted(client.parts) == [1, 2, 3]
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    body = s3_client.get_object(Bucket=bucket, Key=PREFIX + "weights/model.safetensors")["Body"]
    assert body.read() == new
    assert PREFIX + "manifest.json" in keys(s3_client, bucket)
    assert not any("/.publish/" in key for key in keys(s3_client, bucket))


def test_open_upload_without_a_record_is_restarted(
    s3_client: Any, bucket: str, version: Path
) -> None:
    # As an earlier publish, or one cut short between opening the upload and its record, leaves.
    key = PREFIX + "weights/model.safetensors"
    s3_client.create_multipart_upload(Bucket=bucket, Key=key, Metadata={"sha256": "0" * 64})
    plan = publish(s3_client, version, bucket, part_size=PART)
    item = {i.key: i for i in plan.items}[key]
    assert (item.action, item.reason) == (
        "restart",
        "open multipart upload has no record of its content",
    )
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert PREFIX + "manifest.json" in keys(s3_client, bucket)


def test_interrupted_replace_resumes_and_leaves_no_open_upload(
    s3_client: Any, bucket: str, version: Path
) -> None:
    key = PREFIX + "weights/model.safetensors"
    s3_client.put_object(Bucket=bucket, Key=key, Body=b"older build", Metadata={"sha256": "0" * 64})
    kept = publish_cut_after_first_part(s3_client, version, bucket)
    client = CountingClient(s3_client)
    plan = publish(client, version, bucket, part_size=PART, workers=2)
    item = {i.key: i for i in plan.items}[key]
    assert item.action == "resume"
    assert item.reason.startswith(f"bucket has sha256 {'0' * 64}; open multipart upload")
    assert client.calls.get("create_multipart_upload", 0) == 0
    assert sorted(client.parts) == sorted({1, 2, 3} - kept)
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    body = s3_client.get_object(Bucket=bucket, Key=key)["Body"]
    assert body.read() == (version / "weights" / "model.safetensors").read_bytes()


def test_open_uploads_that_no_record_explains_are_aborted(
    s3_client: Any, bucket: str, version: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The recorded upload is resumed; one opened later without a record (a run cut short before
    # writing it) is not the one to continue, and is aborted rather than left open.
    key = PREFIX + "weights/model.safetensors"
    kept = publish_cut_after_first_part(s3_client, version, bucket)
    (recorded,) = s3_client.list_multipart_uploads(Bucket=bucket)["Uploads"]
    stray = s3_client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    client = CountingClient(s3_client)
    with caplog.at_level(logging.WARNING, logger="operations.publish"):
        plan = publish(client, version, bucket, part_size=PART, workers=2)
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert sorted(client.parts) == sorted({1, 2, 3} - kept)
    assert f"aborting multipart upload {stray}" in caplog.text
    item = {i.key: i for i in plan.items}[key]
    assert (item.action, item.upload_id, item.stale_uploads) == (
        "resume",
        recorded["UploadId"],
        (stray,),
    )


def test_open_upload_of_a_skipped_file_is_aborted(
    s3_client: Any, bucket: str, version: Path
) -> None:
    publish(s3_client, version, bucket, part_size=PART)
    key = PREFIX + "weights/model.safetensors"
    stray = s3_client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    plan = publish(s3_client, version, bucket, part_size=PART)
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    item = {i.key: i for i in plan.items}[key]
    assert (item.action, item.stale_uploads) == ("skip", (stray,))


def test_resume_cuts_the_file_as_the_upload_was_opened(
    s3_client: Any, bucket: str, version: Path
) -> None:
    kept = publish_cut_after_first_part(s3_client, version, bucket)
    client = CountingClient(s3_client)
    # A larger configured part size must not change the layout of the upload already open.
    plan = publish(client, version, bucket, part_size=2 * PART)
    item = {i.key: i for i in plan.items}[PREFIX + "weights/model.safetensors"]
    assert sorted(client.parts) == sorted({1, 2, 3} - kept)
    assert (item.action, item.layout.part_size) == ("resume", PART)
    body = s3_client.get_object(Bucket=bucket, Key=PREFIX + "weights/model.safetensors")["Body"]
    assert body.read() == (version / "weights" / "model.safetensors").read_bytes()


MiB, GiB, TiB = 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize(
    ("size", "configured", "part_size", "count"),
    [
        (TiB, DEFAULT_PART_SIZE, 128 * MiB, 8_192),
        (TiB, 5 * MiB, 160 * MiB, 6_554),
        (10_000 * DEFAULT_PART_SIZE, DEFAULT_PART_SIZE, DEFAULT_PART_SIZE, 10_000),
        (10_000 * DEFAULT_PART_SIZE + 1, DEFAULT_PART_SIZE, 2 * DEFAULT_PART_SIZE, 5_001),
        (5 * TiB, DEFAULT_PART_SIZE, 1 * GiB, 5_120),
        (5 * TiB, 6 * GiB, 5 * GiB, 1_024),  # configured above S3's ceiling
        (12 * MiB, 1 * MiB, 5 * MiB, 3),  # configured below S3's floor
        (0, DEFAULT_PART_SIZE, DEFAULT_PART_SIZE, 1),
    ],
    ids=[
        "1tib",
        "1tib-from-5mib",
        "10000-parts",
        "1-byte-over",
        "5tib",
        "over-5gib",
        "under-5mib",
        "empty",
    ],
)
def test_part_layout_stays_within_s3_limits(
    size: int, configured: int, part_size: int, count: int
) -> None:
    layout = part_layout(size, configured)
    assert (layout.part_size, layout.count) == (part_size, count)
    assert 5 * MiB <= layout.part_size <= 5 * GiB and layout.count <= 10_000
    assert sum(layout.length(n) for n in range(1, layout.count + 1)) == size


def test_part_layout_refuses_objects_over_5_tib() -> None:
    with pytest.raises(ValueError, match="object limit"):
        part_layout(5 * TiB + 1)


def test_upload_raises_the_part_size_to_stay_within_the_part_limit(
    s3_client: Any, bucket: str, version: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At two parts an upload, the 12 MiB file needs 10 MiB parts where 5 MiB were configured.
    monkeypatch.setattr("operations.publish.planning._MAX_PARTS", 2)
    client = CountingClient(s3_client)
    plan = publish(client, version, bucket, part_size=PART)
    item = {i.key: i for i in plan.items}[PREFIX + "weights/model.safetensors"]
    assert sorted(client.parts) == [1, 2]
    assert item.layout.part_size == 2 * PART
    body = s3_client.get_object(Bucket=bucket, Key=PREFIX + "weights/model.safetensors")["Body"]
    assert body.read() == (version / "weights" / "model.safetensors").read_bytes()
