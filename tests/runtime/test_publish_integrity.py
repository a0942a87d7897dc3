"""Publish against moto's S3 server: the records folder is publish's alone, and the bytes it
sends are the bytes the manifest's sha256 describes."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import operations.publish.planning as planning_module
import operations.publish.upload as upload_module
from operations.publish import PublishError, publish
from runtime.package import MANIFEST_NAME, PackageError, build_package, load_manifest
from runtime.package.build import file_entry
from tests.runtime.wheelmaker import build_multipart_version, make_source

PART = 5 << 20
PREFIX = "models/toy/v1/"


def keys(client: Any, bucket: str) -> set[str]:
    response = client.list_objects_v2(Bucket=bucket)
    return {o["Key"] for o in response.get("Contents", [])}


@pytest.fixture
def version(tmp_path: Path) -> Path:
    return build_multipart_version(tmp_path)


def test_build_refuses_weights_in_the_records_folder(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src", weights=".publish")
    (source / "weights").rename(source / ".publish")
    with pytest.raises(PackageError, match=r"weights: \.publish: .*\.publish/ is reserved"):
        build_package(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_publish_refuses_a_manifest_listing_files_in_the_records_folder(
    s3_client: Any, bucket: str, version: Path
) -> None:
    # A manifest written by hand (or by an older build) with its weights under .publish/.
    (version / ".publish").mkdir()
    shutil.move(version / "weights" / "config.json", version / ".publish" / "config.json")
    manifest = load_manifest(version / MANIFEST_NAME)
    weights = [e for e in manifest.weight_files if e.path != "weights/config.json"]
    moved = file_entry(version / ".publish" / "config.json", ".publish/config.json")
    sealed = manifest.model_copy(update={"weight_files": [*weights, moved]})
    (version / MANIFEST_NAME).write_text(sealed.to_json())
    with pytest.raises(PublishError, match=r"\.publish/config\.json .* nothing was uploaded"):
        publish(s3_client, version, bucket, part_size=PART)
    assert keys(s3_client, bucket) == set()


def test_only_the_records_of_the_versions_files_are_deleted(
    s3_client: Any, bucket: str, version: Path
) -> None:
    foreign = PREFIX + ".publish/notes.txt"
    s3_client.put_object(Bucket=bucket, Key=foreign, Body=b"not a publish record")
    publish(s3_client, version, bucket, part_size=PART)
    found = keys(s3_client, bucket)
    assert PREFIX + MANIFEST_NAME in found
    # The multipart upload's own record is gone, the object publish did not write is not.
    assert PREFIX + ".publish/weights/model.safetensors.json" not in found
    assert foreign in found


def _rewrite_after_check(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Let `_check_local` pass, then rewrite ``path`` with other bytes of the same size, as a
    writer to the hard-linked source file would between the check and the upload."""
    check = upload_module._check_local

    def check_then_rewrite(folder: Path, entry: Any) -> None:
        check(folder, entry)
        if entry.path == path:
            (folder / entry.path).write_bytes(b"\x01" * entry.size)

    monkeypatch.setattr(upload_module, "_check_local", check_then_rewrite)


def test_single_put_of_changed_bytes_is_refused(
    s3_client: Any, bucket: str, version: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _rewrite_after_check(monkeypatch, "weights/config.json")
    with pytest.raises(PublishError) as err:
        publish(s3_client, version, bucket, part_size=PART)
    assert "weights/config.json changed while it was published" in str(err.value)
    assert "it was not uploaded" in str(err.value)
    found = keys(s3_client, bucket)
    assert PREFIX + "weights/config.json" not in found
    assert PREFIX + MANIFEST_NAME not in found


def test_multipart_upload_of_changed_bytes_is_aborted(
    s3_client: Any, bucket: str, version: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _rewrite_after_check(monkeypatch, "weights/model.safetensors")
    with pytest.raises(PublishError) as err:
        publish(s3_client, version, bucket, part_size=PART, workers=2)
    assert "weights/model.safetensors changed while it was published" in str(err.value)
    assert "its multipart upload was aborted" in str(err.value)
    found = keys(s3_client, bucket)
    assert PREFIX + "weights/model.safetensors" not in found
    assert PREFIX + MANIFEST_NAME not in found
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_manifest_rewritten_during_upload_is_not_what_is_published(
    s3_client: Any, bucket: str, version: Path, tmp_path: Path
) -> None:
    # Another build of the same id and version (other weights) lands on manifest.json mid-upload.
    planned = (version / MANIFEST_NAME).read_bytes()
    other = build_multipart_version(tmp_path / "other")
    swapped: list[int] = []

    def swap_once(n: int) -> None:
        if not swapped:
            (version / MANIFEST_NAME).write_bytes((other / MANIFEST_NAME).read_bytes())
        swapped.append(n)

    publish(s3_client, version, bucket, part_size=PART, workers=1, progress=swap_once)
    published = s3_client.get_object(Bucket=bucket, Key=PREFIX + MANIFEST_NAME)
    body = published["Body"].read()
    assert body == planned
    assert published["Metadata"]["sha256"] == hashlib.sha256(body).hexdigest()
    listed = json.loads(body)
    for entry in [listed["archive"], *listed["weight_files"]]:
        head = s3_client.head_object(Bucket=bucket, Key=PREFIX + entry["path"])
        assert head["Metadata"]["sha256"] == entry["sha256"], entry["path"]


def test_manifest_rewritten_while_planning_is_not_what_is_published(
    s3_client: Any, bucket: str, version: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned = (version / MANIFEST_NAME).read_bytes()
    other = build_multipart_version(tmp_path / "other")
    parse = planning_module.parse_manifest

    def parse_then_rewrite(body: bytes, path: Path) -> Any:
        manifest = parse(body, path)
        path.write_bytes((other / MANIFEST_NAME).read_bytes())
        return manifest

    monkeypatch.setattr(planning_module, "parse_manifest", parse_then_rewrite)
    publish(s3_client, version, bucket, part_size=PART)
    body = s3_client.get_object(Bucket=bucket, Key=PREFIX + MANIFEST_NAME)["Body"].read()
    assert body == planned
