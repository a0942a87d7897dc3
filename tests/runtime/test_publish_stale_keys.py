"""Keys under a version's prefix that its manifest does not list: an earlier build's shard left
by a publish cut short before its manifest would be imported to the model cache and loaded by
vLLM, so publish refuses them (against moto's S3 server over HTTP)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from operations.publish import PublishError, publish
from runtime.package import build_package
from tests.runtime.wheelmaker import make_source

PREFIX = "models/toy/v1/"
MANIFEST = PREFIX + "manifest.json"


class _BeforePut:
    """An S3 client that calls ``before(key)`` ahead of each ``put_object`` it passes on."""

    def __init__(self, client: Any, before: Callable[[str], None]) -> None:
        self._client = client
        self._before = before

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name != "put_object":
            return attr

        def put(**kwargs: Any) -> Any:
            self._before(kwargs["Key"])
            return attr(**kwargs)

        return put


def _cut_before_manifest(key: str) -> None:
    """A publish cut short at its manifest's put."""
    if key == MANIFEST:
        raise ConnectionError("network gone")


def _build(tmp_path: Path, name: str, extra_shard: bool) -> Path:
    source = make_source(tmp_path / f"src-{name}")
    if extra_shard:
        (source / "weights" / "model-00002.safetensors").write_bytes(b"\x01" * 2048)
    build_package(source, tmp_path / f"out-{name}")
    return tmp_path / f"out-{name}"


def _keys(client: Any, bucket: str) -> set[str]:
    response = client.list_objects_v2(Bucket=bucket)
    return {o["Key"] for o in response.get("Contents", [])}


def test_a_rebuild_without_a_shard_is_refused_until_the_shard_is_deleted(
    s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    with pytest.raises(ConnectionError):
        publish(_BeforePut(s3_client, _cut_before_manifest), _build(tmp_path, "a", True), bucket)
    stale = PREFIX + "weights/model-00002.safetensors"
    assert stale in _keys(s3_client, bucket) and MANIFEST not in _keys(s3_client, bucket)
    rebuilt = _build(tmp_path, "b", False)
    before = _keys(s3_client, bucket)

    with pytest.raises(PublishError) as refused:
        publish(s3_client, rebuilt, bucket, wait_replication=False)

    message = str(refused.value)
    assert "weights/model-00002.safetensors" in message
    assert "manifest.json does not list" in message and "nothing was uploaded" in message
    assert f"aws s3 rm s3://{bucket}/{PREFIX}" in message
    assert _keys(s3_client, bucket) == before  # nothing written, the version still invisible
    # Once the developer deletes it, as the message says, the rebuild publishes.
    s3_client.delete_object(Bucket=bucket, Key=stale)
    publish(s3_client, rebuilt, bucket, wait_replication=False)
    assert MANIFEST in _keys(s3_client, bucket)
    assert stale not in _keys(s3_client, bucket)


def test_a_key_that_appears_while_uploading_keeps_the_manifest_back(
    s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    stray = PREFIX + "weights/late.safetensors"

    def stray_appears(key: str) -> None:
        # Another writer puts a key under the prefix as the first file is uploaded.
        if stray not in _keys(s3_client, bucket):
            s3_client.put_object(Bucket=bucket, Key=stray, Body=b"x")

    with pytest.raises(PublishError, match=r"late\.safetensors.*the manifest was not written"):
        publish(
            _BeforePut(s3_client, stray_appears),
            _build(tmp_path, "a", False),
            bucket,
            wait_replication=False,
        )
    assert MANIFEST not in _keys(s3_client, bucket)


def test_publish_records_and_a_republish_of_the_same_build_are_not_refused(
    s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    version = _build(tmp_path, "a", True)
    # Another tool's file under the records folder is not a package file.
    s3_client.put_object(Bucket=bucket, Key=PREFIX + ".publish/other.json", Body=b"{}")
    publish(s3_client, version, bucket, wait_replication=False)
    plan = publish(s3_client, version, bucket, wait_replication=False)
    assert {item.action for item in plan.items} == {"skip"}


def test_folder_markers_under_the_prefix_are_not_refused(
    s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    # The S3 console's "Create folder" (and tools that mimic folders) write empty keys ending in
    # "/": no file for the model cache to import or vLLM to load.
    for marker in (PREFIX, PREFIX + "weights/"):
        s3_client.put_object(Bucket=bucket, Key=marker, Body=b"")
    publish(s3_client, _build(tmp_path, "a", False), bucket, wait_replication=False)
    assert MANIFEST in _keys(s3_client, bucket)
