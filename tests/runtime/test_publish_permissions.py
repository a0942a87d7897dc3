"""Publishing as an IAM user that holds only the S3 permissions docs/packaging.md lists.

moto's S3 server runs in a process of its own with IAM enforcement on
(``INITIAL_NO_AUTH_ACTION_COUNT``): the first requests create an administrator, every later one
is checked against the calling user's policy, as S3 does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from operations.cli import app
from operations.publish import publish
from tests.runtime.interrupted_publish import PART, publish_cut_after_first_part
from tests.runtime.wheelmaker import build_multipart_version
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
PREFIX = "models/toy/v1/"
# What docs/packaging.md says publish needs; publish must succeed, resume included, with these.
DOCUMENTED = (
    "s3:ListBucket",
    "s3:ListBucketMultipartUploads",
    "s3:GetReplicationConfiguration",
    "s3:GetObject",
    "s3:PutObject",
    "s3:ListMultipartUploadParts",
    "s3:AbortMultipartUpload",
    "s3:DeleteObject",
)


def _wait_listening(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"moto server exited with {server.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError("moto server did not listen within 60 s")


def _policy(actions: tuple[str, ...]) -> str:
    statement = {"Effect": "Allow", "Action": list(actions), "Resource": "*"}
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


@pytest.fixture(scope="module")
def iam_endpoint() -> Iterator[tuple[str, dict[str, str]]]:
    """moto with IAM enforced; yields its URL and an administrator's credentials."""
    port = free_port()
    env = {
        **os.environ,
        "INITIAL_NO_AUTH_ACTION_COUNT": "3",  # create_user, put_user_policy, create_access_key
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(port, server)
        url = f"http://127.0.0.1:{port}"
        iam = boto3.client(
            "iam",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        iam.create_user(UserName="admin")
        iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=_policy(("*",)))
        key = iam.create_access_key(UserName="admin")["AccessKey"]
        yield (
            url,
            {
                "aws_access_key_id": key["AccessKeyId"],
                "aws_secret_access_key": key["SecretAccessKey"],
            },
        )
    finally:
        server.terminate()
        server.wait()


def _client(url: str, service: str, credentials: dict[str, str]) -> Any:
    return boto3.client(service, endpoint_url=url, region_name="us-east-1", **credentials)


def _publisher(
    iam_endpoint: tuple[str, dict[str, str]], actions: tuple[str, ...]
) -> tuple[str, dict[str, str]]:
    """A fresh bucket and the credentials of a user allowed only ``actions``."""
    url, admin = iam_endpoint
    bucket = f"models-{uuid.uuid4().hex[:12]}"
    _client(url, "s3", admin).create_bucket(Bucket=bucket)
    iam = _client(url, "iam", admin)
    user = f"publisher-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="publish", PolicyDocument=_policy(actions))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return bucket, {
        "aws_access_key_id": key["AccessKeyId"],
        "aws_secret_access_key": key["SecretAccessKey"],
    }


def test_the_readme_lists_every_permission_publish_is_granted_here() -> None:
    readme = (REPO / "docs" / "packaging.md").read_text()
    assert [a for a in DOCUMENTED if f"`{a}`" not in readme] == []


def test_the_documented_permissions_are_enough_to_publish_and_resume(
    iam_endpoint: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, admin = iam_endpoint
    bucket, credentials = _publisher(iam_endpoint, DOCUMENTED)
    client = _client(url, "s3", credentials)
    version = build_multipart_version(tmp_path)
    publish_cut_after_first_part(client, version, bucket)
    # The rerun lists the open upload and its parts, reads its record, deletes the records.
    plan = publish(client, version, bucket, part_size=PART, workers=1)
    assert "resume" in {item.action for item in plan.items}
    listed = _client(url, "s3", admin).list_objects_v2(Bucket=bucket, Prefix=PREFIX)
    keys = {o["Key"] for o in listed.get("Contents", [])}
    assert PREFIX + "manifest.json" in keys
    assert not any(k.startswith(PREFIX + ".publish/") for k in keys)


def test_a_refused_head_object_names_the_permissions_to_grant(
    iam_endpoint: tuple[str, dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, _ = iam_endpoint
    without_get = tuple(a for a in DOCUMENTED if a != "s3:GetObject")
    bucket, credentials = _publisher(iam_endpoint, without_get)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", credentials["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", credentials["aws_secret_access_key"])
    version = build_multipart_version(tmp_path)
    result = CliRunner().invoke(
        app,
        [
            "publish",
            str(version),
            "--bucket",
            bucket,
            "--endpoint-url",
            url,
            "--region",
            "us-east-1",
        ],
    )
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(
        f"error: cannot read s3://{bucket}/{PREFIX}manifest.json (403 Forbidden)"
    )
    assert "s3:ListBucket" in last and "s3:GetObject" in last


@pytest.mark.parametrize(
    "wrong",
    [
        # moto answers as S3 does: SignatureDoesNotMatch or InvalidAccessKeyId to a GET, and
        # to HEAD a bare 403 without a body to say which.
        {"aws_secret_access_key": "not-the-secret-key"},
        {"aws_access_key_id": "AKIAUNKNOWNKEY000000"},
    ],
    ids=["wrong-secret-key", "unknown-access-key"],
)
def test_a_refused_head_object_also_names_wrong_credentials(
    iam_endpoint: tuple[str, dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    wrong: dict[str, str],
) -> None:
    url, _ = iam_endpoint
    bucket, credentials = _publisher(iam_endpoint, DOCUMENTED)
    credentials = {**credentials, **wrong}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", credentials["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", credentials["aws_secret_access_key"])
    version = build_multipart_version(tmp_path)
    args = ["publish", str(version), "--bucket", bucket, "--endpoint-url", url]
    result = CliRunner().invoke(app, [*args, "--region", "us-east-1"])
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(
        f"error: cannot read s3://{bucket}/{PREFIX}manifest.json (403 Forbidden)"
    )
    # The permissions stay named; the credentials are named beside them, with the check.
    assert "s3:ListBucket" in last and "s3:GetObject" in last
    assert "InvalidAccessKeyId" in last and "SignatureDoesNotMatch" in last
    assert "aws sts get-caller-identity" in last
