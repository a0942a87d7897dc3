"""Open multipart uploads under a version's prefix for keys its manifest no longer lists (a
publish cut short, then a rebuild that renamed or dropped the file): S3 bills their parts until
they are aborted, no object listing shows them, and ``aws s3 rm --recursive`` leaves them; publish
aborts them (against moto's S3 server over HTTP)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from operations.publish import format_plan, publish
from runtime.package import build_package
from tests.runtime.interrupted_publish import PART, publish_cut_after_first_part
from tests.runtime.wheelmaker import build_multipart_version

PREFIX = "models/toy/v1/"
OLD = PREFIX + "weights/model.safetensors"
RECORD = PREFIX + ".publish/weights/model.safetensors.json"


def _resharded(version: Path, tmp_path: Path) -> None:
    """Rebuild ``version`` with its weights under a new shard name, as a re-sharding does."""
    source = tmp_path / "src"
    (source / "weights" / "model.safetensors").rename(
        source / "weights" / "model-00001-of-00001.safetensors"
    )
    shutil.rmtree(version)
    build_package(source, version)


def _keys(client: Any, bucket: str) -> set[str]:
    response = client.list_objects_v2(Bucket=bucket)
    return {o["Key"] for o in response.get("Contents", [])}


def test_open_upload_of_a_file_the_manifest_no_longer_lists_is_aborted(
    s3_client: Any, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    version = build_multipart_version(tmp_path)
    publish_cut_after_first_part(s3_client, version, bucket)
    (left,) = s3_client.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert left["Key"] == OLD and RECORD in _keys(s3_client, bucket)
    _resharded(version, tmp_path)

    planned = publish(s3_client, version, bucket, part_size=PART, dry_run=True)
    assert planned.abandoned_uploads == ((OLD, left["UploadId"]),)
    lines = [" ".join(line.split()) for line in format_plan(planned).splitlines()]
    assert (
        f"abort s3://{bucket}/{OLD} (open multipart upload {left['UploadId']} of a file "
        "manifest.json does not list)" in lines
    )
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) != []

    with caplog.at_level(logging.WARNING, logger="operations.publish"):
        publish(s3_client, version, bucket, part_size=PART)
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert f"aborting multipart upload {left['UploadId']}" in caplog.text
    found = _keys(s3_client, bucket)
    assert PREFIX + "manifest.json" in found
    assert not any("/.publish/" in key for key in found)  # its record went with it
