"""The S3 client publish makes and what it says when S3 answers without saying why (against moto's
S3 server over HTTP)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from typer.testing import CliRunner

import operations.publish.upload as upload_module
from operations.cli import app
from operations.publish import PublishError, publish
from operations.publish.s3 import read_failed
from tests.runtime.interrupted_publish import PART
from tests.runtime.wheelmaker import build_multipart_version

PREFIX = "models/toy/v1/"


class _NoBody:
    """The raw body of a response to HEAD: there is none."""

    def stream(self, **_: Any) -> Any:
        return iter(())


def test_a_bodiless_400_on_head_names_expired_credentials(
    s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    # S3 answers HEAD with expired or invalid temporary credentials (ExpiredToken, InvalidToken)
    # as a bare 400: HEAD has no body to carry the code, so botocore reports "400 Bad Request".
    def expired(request: Any, **_: Any) -> AWSResponse:
        return AWSResponse(request.url, 400, {"x-amz-request-id": "0"}, _NoBody())

    s3_client.meta.events.register("before-send.s3.HeadObject", expired)
    version = build_multipart_version(tmp_path)
    with pytest.raises(PublishError) as err:
        publish(s3_client, version, bucket, part_size=PART)
    message = str(err.value)
    assert message.startswith(f"cannot read s3://{bucket}/{PREFIX}manifest.json (400 Bad Request)")
    assert "expired" in message and "credentials" in message


def test_the_client_has_a_connection_for_every_worker(
    s3_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # botocore keeps 10 connections by default: with more workers, urllib3 opens one per request
    # beyond them and logs "Connection pool is full, discarding connection" for each.
    pools: list[int] = []

    def record_pool(client: Any, *args: Any, **kwargs: Any) -> Any:
        pools.append(client.meta.config.max_pool_connections)
        raise PublishError("stopped by the test")

    monkeypatch.setattr(upload_module, "publish", record_pool)
    args = ["publish", str(tmp_path), "--bucket", "b", "--workers", "32"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert len(pools) == 1 and pools[0] > 32  # the workers, and the thread that drives them


def test_access_denied_with_a_body_names_only_the_permissions() -> None:
    # A GET's error has a body: AccessDenied means S3 accepted the credentials, so only the
    # bodiless 403 of a HEAD also names wrong ones.
    denied = ClientError(
        {"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject"
    )
    message = str(read_failed("b", "k", denied))
    assert "s3:ListBucket" in message and "s3:GetObject" in message
    assert "get-caller-identity" not in message
    bare = ClientError({"Error": {"Code": "403", "Message": "Forbidden"}}, "HeadObject")
    assert "aws sts get-caller-identity" in str(read_failed("b", "k", bare))
