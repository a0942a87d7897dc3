"""S3 reads and messages shared by publish's planning, upload and replication wait."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from botocore.exceptions import ClientError

__all__ = ["SHA_KEY", "PublishError", "head_object", "listed", "read_failed"]

SHA_KEY = "sha256"
"""The object metadata key that carries a file's sha256."""
_LISTED = 10  # file names a message lists before "and N more"


class PublishError(RuntimeError):
    """Publishing stopped; the message says which file and what to do (nothing half-visible)."""


def read_failed(bucket: str, key: str, exc: ClientError) -> PublishError:
    """The error for a HeadObject/GetObject that S3 answered with neither the object nor 404."""
    code = exc.response.get("Error", {}).get("Code")
    if code in ("403", "AccessDenied", "Forbidden"):
        # Without s3:ListBucket, S3 answers 403 rather than 404 for a key that does not exist,
        # which is what publish asks about every file it has not uploaded yet.
        message = (
            f"cannot read s3://{bucket}/{key} (403 Forbidden): publish needs s3:ListBucket on "
            f"s3://{bucket} (without it S3 answers 403, not 404, for a key that is not there "
            "yet) and s3:GetObject on its objects; grant both"
        )
        if code != "AccessDenied":
            # A response to HEAD has no body to name the error: S3 refuses an unknown access key
            # or a wrong secret key there with the same bare 403. AccessDenied (a GET's body)
            # means the credentials were accepted.
            message += (
                "; S3 answers HEAD with the same bare 403 for an unknown access key "
                "(InvalidAccessKeyId) or a wrong secret key (SignatureDoesNotMatch): if aws sts "
                "get-caller-identity, run with the same credentials, fails or names another "
                "identity, fix the credentials first"
            )
        return PublishError(message)
    if code == "400":
        # A response to HEAD has no body to name the error: expired or invalid temporary
        # credentials (ExpiredToken, InvalidToken) reach publish as a bare 400.
        return PublishError(
            f"cannot read s3://{bucket}/{key} (400 Bad Request): S3 answers HEAD this way, without "
            "a reason, when temporary credentials have expired or are invalid (ExpiredToken, "
            "InvalidToken): refresh them (aws sso login, or a new role session; aws sts "
            "get-caller-identity checks them) and run publish again (what it uploaded is kept)"
        )
    return PublishError(f"cannot read s3://{bucket}/{key}: {exc}")


def head_object(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        return client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise read_failed(bucket, key, exc) from exc


def listed(paths: Sequence[str]) -> str:
    """``paths`` joined for a message, the first ten and how many more."""
    shown = ", ".join(paths[:_LISTED])
    return shown if len(paths) <= _LISTED else f"{shown} and {len(paths) - _LISTED} more"
