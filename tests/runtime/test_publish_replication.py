"""Publishing to a replicated bucket: the manifest waits until S3 reports every file replicated.

moto keeps replication rules but never replicates, so these tests talk to it through
`tests.support.s3_replication.ReplicationStandIn`, which reports ``x-amz-replication-status``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from operations.cli import app
from operations.publish import (
    Backoff,
    PublishError,
    Replication,
    ReplicationProgress,
    format_plan,
    publish,
)
from tests.runtime.wheelmaker import build_multipart_version
from tests.support.s3_replication import ReplicationStandIn

PART = 5 << 20
PREFIX = "models/toy/v1/"
MANIFEST = PREFIX + "manifest.json"
WEIGHTS = PREFIX + "weights/model.safetensors"
FILES = (PREFIX + "package.tar", PREFIX + "weights/config.json", WEIGHTS)  # manifest order
FAST = Backoff(first=0.01, most=0.05)


class Interrupted(Exception):
    """Raised by a client to cut a publish short."""


@pytest.fixture
def standin(s3_endpoint: str) -> Iterator[ReplicationStandIn]:
    with ReplicationStandIn(s3_endpoint) as proxy:
        yield proxy


@pytest.fixture
def client(s3_env: dict[str, str], standin: ReplicationStandIn) -> Any:
    return boto3.client("s3", endpoint_url=standin.url, region_name="us-east-1")


@pytest.fixture
def bucket(client: Any, bucket: str) -> str:
    """The model bucket, versioned as S3 requires of both ends of a replication rule."""
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    return bucket


@pytest.fixture
def version(tmp_path: Path) -> Path:
    # Two 5 MiB parts: the weights reach S3 through CompleteMultipartUpload.
    return build_multipart_version(tmp_path, 6 << 20)


def replicate(client: Any, bucket: str, prefix: str = "models/", status: str = "Enabled") -> None:
    """A replication rule like components/shared_artifacts.py's, to a versioned replica."""
    replica = f"{bucket}-replica"
    client.create_bucket(Bucket=replica)
    client.put_bucket_versioning(Bucket=replica, VersioningConfiguration={"Status": "Enabled"})
    rule = {
        "ID": "models-to-eu-west-1",
        "Priority": 0,
        "Status": status,
        "Filter": {"Prefix": prefix},
        "DeleteMarkerReplication": {"Status": "Enabled"},
        "Destination": {"Bucket": f"arn:aws:s3:::{replica}", "StorageClass": "STANDARD"},
    }
    client.put_bucket_replication(
        Bucket=bucket,
        ReplicationConfiguration={"Role": "arn:aws:iam::123456789012:role/r", "Rules": [rule]},
    )


def keys(client: Any, bucket: str) -> set[str]:
    response = client.list_objects_v2(Bucket=bucket)
    return {o["Key"] for o in response.get("Contents", [])}


@pytest.mark.parametrize(
    "rule",
    [None, {"prefix": "logs/"}, {"status": "Disabled"}],
    ids=["no-configuration", "other-prefix", "disabled-rule"],
)
def test_without_a_rule_for_the_version_the_manifest_does_not_wait(
    client: Any,
    bucket: str,
    version: Path,
    standin: ReplicationStandIn,
    rule: dict[str, str] | None,
) -> None:
    if rule is not None:
        replicate(client, bucket, **rule)
    plan = publish(client, version, bucket, part_size=PART, backoff=FAST)
    assert plan.replication == Replication(checked=True)
    assert f"no replication rule of s3://{bucket} covers {PREFIX}" in format_plan(plan)
    assert MANIFEST in keys(client, bucket)
    assert not any(status == "PENDING" for status, _ in standin.log)


def test_the_manifest_is_written_only_after_every_file_replicated(
    client: Any, bucket: str, version: Path, standin: ReplicationStandIn
) -> None:
    replicate(client, bucket)
    standin.script(PREFIX + "package.tar", ["PENDING", "COMPLETED"])
    standin.script(WEIGHTS, ["PENDING"] * 4 + ["COMPLETED"])
    standin.script(PREFIX + "weights/config.json", ["COMPLETED"])
    polls: list[ReplicationProgress] = []
    plan = publish(
        client, version, bucket, part_size=PART, backoff=FAST, on_replication=polls.append
    )
    assert plan.replication == Replication(True, ("models-to-eu-west-1",), FILES)
    log = standin.log
    manifest_written = log.index(("write", MANIFEST))
    for key in FILES:
        assert log.index(("COMPLETED", key)) < manifest_written, key
    assert ("PENDING", WEIGHTS) in log
    assert polls[-1] == ReplicationProgress(f"s3://{bucket}/{PREFIX}", 3, 3, ())
    assert any(p.pending == ("weights/model.safetensors",) for p in polls)
    assert "pending: weights/model.safetensors" in str(polls[0])
    assert MANIFEST in keys(client, bucket)


def test_a_failed_replication_is_named_and_the_manifest_not_written(
    client: Any, bucket: str, version: Path, standin: ReplicationStandIn
) -> None:
    replicate(client, bucket)
    for key in FILES:
        standin.script(key, ["PENDING", "COMPLETED"])
    standin.script(WEIGHTS, ["PENDING", "PENDING", "FAILED"])
    with pytest.raises(PublishError) as err:
        publish(client, version, bucket, part_size=PART, backoff=FAST)
    message = str(err.value)
    assert message.startswith("replication FAILED for weights/model.safetensors in ")
    assert "S3 Batch Replication" in message
    assert MANIFEST not in keys(client, bucket)


def test_a_timeout_stops_without_the_manifest_and_a_rerun_waits_for_files_already_there(
    client: Any, bucket: str, version: Path, standin: ReplicationStandIn
) -> None:
    replicate(client, bucket)
    for key in FILES:
        standin.script(key, ["COMPLETED"])
    standin.script(WEIGHTS, ["PENDING"])
    with pytest.raises(PublishError) as err:
        publish(client, version, bucket, part_size=PART, backoff=FAST, replication_timeout=0.2)
    message = str(err.value)
    assert "did not finish within 0.2 s, still PENDING: weights/model.safetensors;" in message
    assert "--replication-timeout" in message
    assert MANIFEST not in keys(client, bucket)

    standin.script(WEIGHTS, ["PENDING", "PENDING", "COMPLETED"])
    plan = publish(client, version, bucket, part_size=PART, backoff=FAST)
    assert {i.action for i in plan.items} == {"skip"}
    assert standin.log.index(("COMPLETED", WEIGHTS)) < standin.log.index(("write", MANIFEST))


def test_files_written_before_the_rule_are_refused_before_uploading(
    client: Any, bucket: str, version: Path, standin: ReplicationStandIn
) -> None:
    class CutShort:
        """Fails to complete the weights' multipart upload: the small files stay in the bucket."""

        def __getattr__(self, name: str) -> Any:
            return getattr(client, name)

        def complete_multipart_upload(self, **kwargs: Any) -> Any:
            raise Interrupted

    # One worker: the small files go up before the weights' parts, in submission order.
    with pytest.raises(Interrupted):
        publish(CutShort(), version, bucket, part_size=PART, workers=1)
    replicate(client, bucket)
    writes = len(standin.log)
    with pytest.raises(PublishError) as err:
        publish(client, version, bucket, part_size=PART, backoff=FAST)
    message = str(err.value)
    assert message.startswith(
        f"package.tar, weights/config.json in s3://{bucket}/{PREFIX} have no replication status"
    )
    assert "copy them to every destination with S3 Batch Replication" in message
    assert standin.log[writes:] == []  # refused before the weights went up
    assert MANIFEST not in keys(client, bucket)


def test_no_wait_replication_warns_and_writes_the_manifest(
    client: Any,
    bucket: str,
    version: Path,
    standin: ReplicationStandIn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    replicate(client, bucket)
    standin.deny.add("GetBucketReplication")  # not even asked
    with caplog.at_level(logging.WARNING, logger="operations.publish"):
        plan = publish(client, version, bucket, part_size=PART, wait_replication=False)
    assert plan.replication == Replication(checked=False)
    assert "not waiting for replication (--no-wait-replication)" in caplog.text
    assert "replica regions may see the manifest before the files it lists" in caplog.text
    assert MANIFEST in keys(client, bucket)
    # The manifest went up while the weights were still on their way to the replica.
    assert client.head_object(Bucket=bucket, Key=WEIGHTS)["ReplicationStatus"] == "PENDING"


def test_access_denied_on_the_replication_configuration_says_what_to_grant(
    client: Any, bucket: str, version: Path, standin: ReplicationStandIn
) -> None:
    replicate(client, bucket)
    standin.deny.add("GetBucketReplication")
    with pytest.raises(PublishError) as err:
        publish(client, version, bucket, part_size=PART)
    message = str(err.value)
    assert f"cannot read the replication configuration of s3://{bucket} (AccessDenied)" in message
    assert "s3:GetReplicationConfiguration" in message and "--no-wait-replication" in message
    assert keys(client, bucket) == set()


@pytest.mark.parametrize(
    ("replicated", "wait", "line"),
    [
        (
            True,
            True,
            "wait 3 files until replicated to every destination (rules models-to-eu-west-1), "
            "then the manifest",
        ),
        (False, True, f"no wait no replication rule of s3://{{bucket}} covers {PREFIX}"),
        (
            True,
            False,
            "no wait for replication (--no-wait-replication): replica regions may see the "
            "manifest before its files",
        ),
    ],
    ids=["rule", "no-rule", "no-wait"],
)
def test_dry_run_says_whether_the_manifest_waits_for_replication(
    client: Any, bucket: str, version: Path, replicated: bool, wait: bool, line: str
) -> None:
    if replicated:
        replicate(client, bucket)
    plan = publish(client, version, bucket, dry_run=True, wait_replication=wait)
    lines = format_plan(plan).splitlines()
    assert " ".join(lines[-3].split()) == line.format(bucket=bucket)
    assert lines[-2].startswith("manifest")
    assert keys(client, bucket) == set()


def test_cli_waits_for_replication_and_reports_a_timeout_in_one_line(
    client: Any, bucket: str, version: Path, standin: ReplicationStandIn
) -> None:
    replicate(client, bucket)
    runner = CliRunner()
    args = ["publish", str(version), "--bucket", bucket, "--endpoint-url", standin.url]
    result = runner.invoke(app, [*args, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "files until replicated to every destination" in result.output

    result = runner.invoke(app, [*args, "--part-size-mb", "5", "--replication-timeout", "0"])
    assert result.exit_code == 1
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: replication of ") and "still PENDING" in last
    assert f"replication of s3://{bucket}/{PREFIX}: 0 of 3 files done; pending:" in result.output

    for key in FILES:
        standin.script(key, ["COMPLETED"])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"replication of s3://{bucket}/{PREFIX}: 3 of 3 files done" in result.output
    assert result.output.strip().endswith(f"published s3://{bucket}/{MANIFEST}")
