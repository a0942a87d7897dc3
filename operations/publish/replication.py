"""Publish's wait for Cross-Region Replication: which rules cover the version, and polling
until S3 reports every covered file at every destination before the manifest is written."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from operations.publish.s3 import PublishError, head_object, listed

__all__ = [
    "DEFAULT_REPLICATION_TIMEOUT",
    "NO_REPLICATION",
    "Backoff",
    "Replication",
    "ReplicationProgress",
    "refuse_unreplicable",
    "replication_for",
    "wait_replicated",
]

DEFAULT_REPLICATION_TIMEOUT = 3600.0
# HeadObject's ReplicationStatus on a source object: COMPLETE is the older spelling of COMPLETED.
_REPLICATED = ("COMPLETED", "COMPLETE")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Replication:
    """What the bucket's replication rules mean for the version: the enabled rules that cover its
    files and the keys to wait for; ``checked`` is False when publish was told not to wait."""

    checked: bool
    rules: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()


NO_REPLICATION = Replication(checked=False)
"""What a plan carries when publish was told not to wait for replication."""


@dataclass(frozen=True)
class Backoff:
    """Seconds between replication polls: ``first``, then doubled each poll up to ``most``."""

    first: float = 1.0
    most: float = 30.0


@dataclass(frozen=True)
class ReplicationProgress:
    """One poll of the version's replication: files at every destination, keys still pending."""

    location: str
    replicated: int
    total: int
    pending: tuple[str, ...]
    """Paths within the version, as the manifest lists them."""

    def __str__(self) -> str:
        line = f"replication of {self.location}: {self.replicated} of {self.total} files done"
        if not self.pending:
            return line
        return f"{line}; pending: {listed(self.pending)}"


def _replication_rules(client: Any, bucket: str) -> list[dict[str, Any]]:
    """The bucket's replication rules, none when it has no replication configuration."""
    try:
        response = client.get_bucket_replication(Bucket=bucket)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if code == "ReplicationConfigurationNotFoundError":
            return []
        if code == "AccessDenied":
            raise PublishError(
                f"cannot read the replication configuration of s3://{bucket} (AccessDenied): "
                "publish needs s3:GetReplicationConfiguration on the bucket to know whether to "
                "wait for replication before writing the manifest; nothing was uploaded: grant "
                "it, or pass --no-wait-replication (replica regions may then see manifest.json "
                "before its files)"
            ) from exc
        raise
    return list(response.get("ReplicationConfiguration", {}).get("Rules", []))


def _covers(rule: dict[str, Any], key: str) -> bool:
    """Whether an enabled ``rule`` replicates ``key``; publish tags nothing, so a rule that also
    filters on tags replicates none of its objects."""
    if rule.get("Status") != "Enabled":
        return False
    if "Filter" not in rule:
        return key.startswith(rule.get("Prefix", ""))  # the older, filterless rule form
    filter_ = rule["Filter"]
    if "Tag" in filter_ or filter_.get("And", {}).get("Tags"):
        return False
    prefix = filter_.get("And", {}).get("Prefix", filter_.get("Prefix", ""))
    return key.startswith(prefix)


def replication_for(client: Any, bucket: str, keys: Sequence[str]) -> Replication:
    """The enabled rules of ``bucket`` that cover any of ``keys``, and the keys they cover."""
    rules = _replication_rules(client, bucket)
    covering = [r for r in rules if any(_covers(r, key) for key in keys)]
    covered = tuple(key for key in keys if any(_covers(r, key) for r in covering))
    return Replication(True, tuple(str(r.get("ID", "")) for r in covering), covered)


def _never_replicated(bucket: str, prefix: str, paths: Sequence[str], rules: Sequence[str]) -> str:
    return (
        f"{listed(paths)} in s3://{bucket}/{prefix} have no replication status, so S3 will never "
        f"copy them to the replica regions (rules {', '.join(rules)} only replicate objects "
        "written after they were enabled, and never replicas of another bucket); the manifest "
        "was not written: copy them to every destination with S3 Batch Replication (a Batch "
        "Operations job with the Replicate operation on these keys), then run publish again"
    )


def _replication_failed(bucket: str, prefix: str, paths: Sequence[str]) -> str:
    return (
        f"replication FAILED for {listed(paths)} in s3://{bucket}/{prefix}; the manifest was "
        "not written: S3 does not retry a failed replication: check the replication role's "
        "permissions and the destination buckets (versioning, encryption), then replicate them "
        "again with S3 Batch Replication and run publish again"
    )


def refuse_unreplicable(
    bucket: str, prefix: str, statuses: dict[str, str | None], rules: Sequence[str]
) -> None:
    """Raise `PublishError` if any key's ``ReplicationStatus`` says S3 will not replicate it:
    FAILED, or none at all (written before the rule)."""
    failed = [k.removeprefix(prefix) for k, status in statuses.items() if status == "FAILED"]
    if failed:
        raise PublishError(_replication_failed(bucket, prefix, failed))
    never = [
        k.removeprefix(prefix)
        for k, status in statuses.items()
        if status not in ("PENDING", "FAILED", *_REPLICATED)
    ]
    if never:
        raise PublishError(_never_replicated(bucket, prefix, never, rules))


def wait_replicated(
    client: Any,
    bucket: str,
    prefix: str,
    replication: Replication,
    timeout: float,
    backoff: Backoff,
    on_replication: Callable[[ReplicationProgress], None] | None,
) -> None:
    """Poll HeadObject until every covered file is at every destination; raises `PublishError`
    on a FAILED file, on one S3 will never replicate, or once ``timeout`` seconds have passed."""
    pending = list(replication.keys)
    deadline = time.monotonic() + timeout
    delay = backoff.first
    while True:
        statuses: dict[str, str | None] = {}
        for key in pending:
            head = head_object(client, bucket, key)
            if head is None:
                raise PublishError(
                    f"s3://{bucket}/{key} disappeared while waiting for its replication; the "
                    "manifest was not written: run publish again"
                )
            statuses[key] = head.get("ReplicationStatus")
        refuse_unreplicable(bucket, prefix, statuses, replication.rules)
        pending = [k for k, status in statuses.items() if status == "PENDING"]
        total = len(replication.keys)
        progress = ReplicationProgress(
            f"s3://{bucket}/{prefix}",
            total - len(pending),
            total,
            tuple(k.removeprefix(prefix) for k in pending),
        )
        logger.info("%s", progress)
        if on_replication is not None:
            on_replication(progress)
        if not pending:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise PublishError(
                f"replication of s3://{bucket}/{prefix} did not finish within {timeout:g} s, "
                f"still PENDING: {listed(progress.pending)}; the manifest was not written: run "
                "publish again to keep waiting (uploaded files are skipped) or raise "
                "--replication-timeout; if it stays PENDING, check the replication rules' "
                "destinations and role"
            )
        time.sleep(min(delay, left))
        delay = min(2 * delay, backoff.most)
