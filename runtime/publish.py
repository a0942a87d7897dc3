"""``llm-serving publish``: upload a built version folder to the regional model bucket.

Objects land under ``models/<model_id>/<model_version>/`` with their sha256 in the object
metadata. Large files go up as parallel multipart uploads that a later run resumes (it finds the
open upload in S3 and keeps every part whose ETag matches), files already there with the same
checksum are skipped, and ``manifest.json`` is written last, so a reader that finds the manifest
finds every file it lists.

The bucket's Cross-Region Replication copies each object on its own and in no order, so where a
rule covers the version, publish first waits until S3 reports every file (uploaded now or already
there) ``COMPLETED`` at every destination; a replica region then never sees a manifest early.

S3 cannot return the metadata of an open multipart upload, so each one gets a small record
object under ``<version>/.publish/`` saying which content (sha256, size) and part size it was
opened for; a resume that finds another content, or no record, aborts the upload and starts
again, and any other open upload of the key is aborted as left behind by an earlier run. The
records are removed before the manifest is written, which is why packages may not keep files
there.

Each file is hashed again while it is read for upload (not read twice), so a file rewritten after
the checks is never stored under the manifest's sha256: its upload is refused or aborted. The
manifest is read once, when planning, and those very bytes are what publish writes last.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from runtime.package.build import file_entry
from runtime.package.errors import PackageError
from runtime.package.manifest import (
    MANIFEST_NAME,
    RECORDS_DIR,
    FileEntry,
    parse_manifest,
    read_manifest_bytes,
)

__all__ = [
    "DEFAULT_PART_SIZE",
    "DEFAULT_REPLICATION_TIMEOUT",
    "Backoff",
    "PartLayout",
    "PlanItem",
    "PublishError",
    "PublishPlan",
    "Replication",
    "ReplicationProgress",
    "format_plan",
    "part_layout",
    "plan_publish",
    "publish",
    "run_publish",
    "version_prefix",
]

DEFAULT_PART_SIZE = 64 << 20
# S3's multipart limits: parts of 5 MiB (but the last) to 5 GiB, 10,000 parts, 5 TiB objects.
_MIN_PART_SIZE = 5 << 20
_MAX_PART_SIZE = 5 << 30
_MAX_PARTS = 10_000
_MAX_OBJECT_SIZE = 5 << 40
_SHA_KEY = "sha256"
_RECORDS = f"{RECORDS_DIR}/"  # under the version prefix: one record per open multipart upload
DEFAULT_REPLICATION_TIMEOUT = 3600.0
# HeadObject's ReplicationStatus on a source object: COMPLETE is the older spelling of COMPLETED.
_REPLICATED = ("COMPLETED", "COMPLETE")
_LISTED = 10  # file names a message lists before "and N more"
Action = Literal["upload", "resume", "restart", "replace", "skip"]
Progress = Callable[[int], None]
PartETags = tuple[tuple[int, str], ...]
"""``(part number, md5 hex)`` of the parts an open upload already holds."""

logger = logging.getLogger(__name__)


class PublishError(RuntimeError):
    """Publishing stopped; the message says which file and what to do (nothing half-visible)."""


@dataclass(frozen=True)
class PartLayout:
    """How a file of ``size`` bytes is cut for multipart: ``part_size`` bytes a part, the last
    one possibly shorter."""

    size: int
    part_size: int

    @property
    def count(self) -> int:
        """Number of parts; an empty file still has one."""
        return max(1, -(-self.size // self.part_size))

    def length(self, number: int) -> int:
        """Bytes in part ``number`` (1-based)."""
        return min(self.part_size, self.size - (number - 1) * self.part_size)


def part_layout(size: int, part_size: int = DEFAULT_PART_SIZE) -> PartLayout:
    """The layout for ``size`` bytes: ``part_size`` held within S3's 5 MiB to 5 GiB, doubled until
    the file fits in 10,000 parts; raises `ValueError` over S3's 5 TiB object limit."""
    if size > _MAX_OBJECT_SIZE:
        raise ValueError(f"{size:,d} bytes is over S3's {_MAX_OBJECT_SIZE:,d}-byte object limit")
    layout = PartLayout(size, min(max(part_size, _MIN_PART_SIZE), _MAX_PART_SIZE))
    while layout.count > _MAX_PARTS and layout.part_size < _MAX_PART_SIZE:
        layout = PartLayout(size, min(2 * layout.part_size, _MAX_PART_SIZE))
    return layout


@dataclass(frozen=True)
class PlanItem:
    """What publishing does with one file.

    ``layout`` cuts the file (a resume keeps the one its upload was opened with); ``upload_id``
    is the open upload to continue (``resume``) or to abort first (``restart``); ``kept_parts``
    are the parts a resumed upload already holds; ``stale_uploads`` are the key's other open
    uploads, which no record explains, aborted before anything is sent.
    """

    key: str
    entry: FileEntry
    action: Action
    reason: str
    layout: PartLayout
    upload_id: str | None = None
    kept_parts: PartETags = ()
    stale_uploads: tuple[str, ...] = ()


@dataclass(frozen=True)
class _UploadRecord:
    """What an open multipart upload was opened for, stored beside it as JSON."""

    upload_id: str
    sha256: str
    size: int
    part_size: int


@dataclass(frozen=True)
class Replication:
    """What the bucket's replication rules mean for the version: the enabled rules that cover its
    files and the keys to wait for; ``checked`` is False when publish was told not to wait."""

    checked: bool
    rules: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()


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
        return f"{line}; pending: {_names(self.pending)}"


@dataclass(frozen=True)
class PublishPlan:
    """Every file's action, the manifest's key and the bytes written there last, and whether the
    manifest waits for replication."""

    bucket: str
    items: tuple[PlanItem, ...]
    manifest_key: str
    manifest_body: bytes = field(repr=False)
    """``manifest.json`` as read when planning: the file list the plan carries out."""
    manifest_sha256: str
    replication: Replication = Replication(checked=False)

    @property
    def prefix(self) -> str:
        """The version's key prefix, ending in ``/``."""
        return self.manifest_key.removesuffix(MANIFEST_NAME)

    @property
    def bytes_to_send(self) -> int:
        """Bytes the plan uploads (resumed files count whole; kept parts are credited later)."""
        return sum(i.entry.size for i in self.items if i.action != "skip")


def version_prefix(model_id: str, model_version: str, root: str = "models") -> str:
    """``models/<id>/<version>/``: the layout the FSx data repository association expects."""
    return f"{root.strip('/')}/{model_id}/{model_version}/"


def _read_failed(bucket: str, key: str, exc: ClientError) -> PublishError:
    """The error for a HeadObject/GetObject that S3 answered with neither the object nor 404."""
    code = exc.response.get("Error", {}).get("Code")
    if code in ("403", "AccessDenied", "Forbidden"):
        # Without s3:ListBucket, S3 answers 403 rather than 404 for a key that does not exist,
        # which is what publish asks about every file it has not uploaded yet.
        return PublishError(
            f"cannot read s3://{bucket}/{key} (403 Forbidden): publish needs s3:ListBucket on "
            f"s3://{bucket} (without it S3 answers 403, not 404, for a key that is not there "
            "yet) and s3:GetObject on its objects; grant both"
        )
    return PublishError(f"cannot read s3://{bucket}/{key}: {exc}")


def _head(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        return client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise _read_failed(bucket, key, exc) from exc


def _open_uploads(client: Any, bucket: str, prefix: str) -> dict[str, list[str]]:
    """The ids of the open multipart uploads under ``prefix``, per key, oldest first."""
    found: dict[str, list[dict[str, Any]]] = {}
    paginator = client.get_paginator("list_multipart_uploads")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for upload in page.get("Uploads", []):
            found.setdefault(upload["Key"], []).append(upload)
    return {
        key: [u["UploadId"] for u in sorted(uploads, key=lambda u: u["Initiated"])]
        for key, uploads in found.items()
    }


def _record_key(prefix: str, entry: FileEntry) -> str:
    return f"{prefix}{_RECORDS}{entry.path}.json"


def _read_record(client: Any, bucket: str, key: str) -> _UploadRecord | None:
    """The record at ``key``, or None when there is none or it cannot be understood."""
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise _read_failed(bucket, key, exc) from exc
    try:
        record = _UploadRecord(**json.loads(body))
    except (ValueError, TypeError):
        return None  # not ours or damaged: the upload is then treated as of unknown content
    fields = (record.upload_id, record.sha256, record.size, record.part_size)
    return record if tuple(map(type, fields)) == (str, str, int, int) else None


def _kept_parts(client: Any, bucket: str, key: str, upload_id: str) -> dict[int, tuple[str, int]]:
    """``{part number: (md5 hex, size)}`` of the parts the open upload holds."""
    kept: dict[int, tuple[str, int]] = {}
    paginator = client.get_paginator("list_parts")
    for page in paginator.paginate(Bucket=bucket, Key=key, UploadId=upload_id):
        for part in page.get("Parts", []):
            kept[part["PartNumber"]] = (part["ETag"].strip('"'), part["Size"])
    return kept


def _resume_or_restart(
    client: Any,
    bucket: str,
    key: str,
    entry: FileEntry,
    upload_id: str,
    record: _UploadRecord | None,
    layout: PartLayout,
) -> PlanItem:
    """Resume the open upload only if its record says it holds this very file, cut as recorded.

    S3 fixes an upload's metadata (our sha256) when it is opened, so an upload of older content
    cannot be repaired by replacing parts: it is aborted and a fresh one opened (``restart``).
    """
    if record is None or record.upload_id != upload_id:
        reason = "open multipart upload has no record of its content"
        return PlanItem(key, entry, "restart", reason, layout, upload_id)
    if (record.sha256, record.size) != (entry.sha256, entry.size):
        reason = (
            f"open multipart upload is of sha256 {record.sha256} ({record.size:,d} bytes), "
            f"the file is now {entry.sha256} ({entry.size:,d} bytes)"
        )
        return PlanItem(key, entry, "restart", reason, layout, upload_id)
    recorded = PartLayout(entry.size, record.part_size)
    if not _MIN_PART_SIZE <= record.part_size <= _MAX_PART_SIZE or recorded.count > _MAX_PARTS:
        reason = f"open multipart upload has {record.part_size:,d}-byte parts, beyond S3's limits"
        return PlanItem(key, entry, "restart", reason, layout, upload_id)
    kept = _kept_parts(client, bucket, key, upload_id)
    for number, (_, size) in sorted(kept.items()):
        if number > recorded.count or size != recorded.length(number):
            reason = (
                f"open multipart upload's part {number} is {size:,d} bytes, its recorded "
                f"layout ({recorded.part_size:,d}-byte parts) says otherwise"
            )
            return PlanItem(key, entry, "restart", reason, layout, upload_id)
    reason = f"open multipart upload, {len(kept)} of {recorded.count} parts in the bucket"
    etags = tuple((number, md5) for number, (md5, _) in sorted(kept.items()))
    return PlanItem(key, entry, "resume", reason, recorded, upload_id, etags)


def _with_stale(item: PlanItem, uploads: Sequence[str]) -> PlanItem:
    """``item``, also aborting the key's open uploads other than the one it continues or restarts:
    no record explains them, and left by an earlier run they would stay open (and billed) forever.
    """
    # Only a publish of this very version opens uploads under its keys (other versions have other
    # prefixes); two publishes of one version at once are not supported, and already abort each
    # other's unrecorded uploads as ``restart``.
    stale = tuple(u for u in uploads if u != item.upload_id)
    if not stale:
        return item
    reason = f"{item.reason}; aborting {len(stale)} other open multipart upload(s) of no record"
    return replace(item, reason=reason, stale_uploads=stale)


def _names(paths: Sequence[str]) -> str:
    shown = ", ".join(paths[:_LISTED])
    return shown if len(paths) <= _LISTED else f"{shown} and {len(paths) - _LISTED} more"


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


def _replication_for(client: Any, bucket: str, keys: Sequence[str]) -> Replication:
    rules = _replication_rules(client, bucket)
    covering = [r for r in rules if any(_covers(r, key) for key in keys)]
    covered = tuple(key for key in keys if any(_covers(r, key) for r in covering))
    return Replication(True, tuple(str(r.get("ID", "")) for r in covering), covered)


def _never_replicated(bucket: str, prefix: str, paths: Sequence[str], rules: Sequence[str]) -> str:
    return (
        f"{_names(paths)} in s3://{bucket}/{prefix} have no replication status, so S3 will never "
        f"copy them to the replica regions (rules {', '.join(rules)} only replicate objects "
        "written after they were enabled, and never replicas of another bucket); the manifest "
        "was not written: copy them to every destination with S3 Batch Replication (a Batch "
        "Operations job with the Replicate operation on these keys), then run publish again"
    )


def _replication_failed(bucket: str, prefix: str, paths: Sequence[str]) -> str:
    return (
        f"replication FAILED for {_names(paths)} in s3://{bucket}/{prefix}; the manifest was "
        "not written: S3 does not retry a failed replication: check the replication role's "
        "permissions and the destination buckets (versioning, encryption), then replicate them "
        "again with S3 Batch Replication and run publish again"
    )


def _refuse_unreplicable(
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


def _check_present(folder: Path, entries: list[FileEntry]) -> None:
    """Every listed file is readable and of the listed size, checked before any S3 call."""
    for entry in entries:
        path = folder / entry.path
        try:
            with path.open("rb") as handle:  # opening, not just stat, proves it readable
                size = os.fstat(handle.fileno()).st_size
        except FileNotFoundError:
            raise PublishError(
                f"{entry.path} is missing from {folder} (the manifest lists it, {entry.size:,d} "
                "bytes); nothing was uploaded: rebuild the package (llm-serving package build) "
                "or check the folder path"
            ) from None
        except OSError as exc:
            raise PublishError(
                f"cannot read {path}: {exc.strerror}; nothing was uploaded: check the file's "
                "permissions or rebuild the package (llm-serving package build)"
            ) from exc
        if size != entry.size:
            raise PublishError(
                f"{path} is {size:,d} bytes, the manifest says {entry.size:,d}; nothing was "
                "uploaded: rebuild the package (llm-serving package build)"
            )


def plan_publish(
    client: Any,
    folder: Path,
    bucket: str,
    root: str = "models",
    part_size: int = DEFAULT_PART_SIZE,
    wait_replication: bool = True,
) -> PublishPlan:
    """Decide, for every file of the version folder, whether to upload, resume or skip it, and
    (with ``wait_replication``) which files the bucket's replication rules cover.

    A covered file already in the bucket that S3 will never replicate (no status, or FAILED)
    raises `PublishError` here, before anything is uploaded.
    """
    # Read once: these very bytes are what publish writes last, so they list what it uploaded.
    manifest_body = read_manifest_bytes(folder / MANIFEST_NAME)
    manifest = parse_manifest(manifest_body, folder / MANIFEST_NAME)
    entries = [manifest.archive, *manifest.weight_files]
    reserved = [e.path for e in entries if e.path.startswith(_RECORDS)]
    if reserved:
        raise PublishError(
            f"{_names(reserved)} in {folder} are under {_RECORDS}, where publish keeps its "
            "upload records in the bucket and deletes them; nothing was uploaded: rebuild the "
            "package with the weights in another folder"
        )
    _check_present(folder, entries)
    for entry in entries:
        if entry.size > _MAX_OBJECT_SIZE:
            raise PublishError(
                f"{entry.path} is {entry.size:,d} bytes, over S3's limit of "
                f"{_MAX_OBJECT_SIZE:,d} bytes (5 TiB) for one object: split it into smaller files"
            )
    prefix = version_prefix(manifest.model_id, manifest.model_version, root)
    manifest_key = prefix + MANIFEST_NAME
    remote_manifest = _head(client, bucket, manifest_key)
    local_manifest_sha = hashlib.sha256(manifest_body).hexdigest()
    if (
        remote_manifest is not None
        and remote_manifest.get("Metadata", {}).get(_SHA_KEY) != local_manifest_sha
    ):
        raise PublishError(
            f"{manifest.model_id}/{manifest.model_version} is already published at "
            f"s3://{bucket}/{prefix} with another manifest; versions are immutable: "
            "build the package with a new model_version"
        )
    open_uploads = _open_uploads(client, bucket, prefix)
    items = []
    skipped: dict[str, str | None] = {}  # key -> ReplicationStatus of the files kept as they are
    for entry in entries:
        key = prefix + entry.path
        layout = part_layout(entry.size, part_size)
        uploads = open_uploads.get(key, [])
        head = _head(client, bucket, key)
        remote_sha = None if head is None else head.get("Metadata", {}).get(_SHA_KEY)
        if head is None:
            item = PlanItem(key, entry, "upload", "not in the bucket", layout)
        elif remote_sha == entry.sha256 and head["ContentLength"] == entry.size:
            item = PlanItem(key, entry, "skip", "same sha256 already in the bucket", layout)
            skipped[key] = head.get("ReplicationStatus")
        else:
            item = PlanItem(key, entry, "replace", f"bucket has sha256 {remote_sha}", layout)
        if uploads and item.action != "skip":
            record = _read_record(client, bucket, _record_key(prefix, entry))
            upload_id = uploads[-1]
            if record is not None and record.upload_id in uploads:
                upload_id = record.upload_id
            resumed = _resume_or_restart(client, bucket, key, entry, upload_id, record, layout)
            # A completed upload replaces the older build's object as a fresh one would.
            reason = resumed.reason if head is None else f"{item.reason}; {resumed.reason}"
            item = replace(resumed, reason=reason)
        items.append(_with_stale(item, uploads))
    replication = Replication(checked=False)
    if wait_replication:
        replication = _replication_for(client, bucket, [item.key for item in items])
        statuses = {key: skipped[key] for key in replication.keys if key in skipped}
        _refuse_unreplicable(bucket, prefix, statuses, replication.rules)
    return PublishPlan(
        bucket, tuple(items), manifest_key, manifest_body, local_manifest_sha, replication
    )


def format_plan(plan: PublishPlan) -> str:
    """The plan as printed by ``--dry-run``: one line per file, the wait for replication, the
    manifest last."""
    lines = [
        f"{item.action:8} {item.entry.size:>14,d} B  s3://{plan.bucket}/{item.key}  ({item.reason})"
        for item in plan.items
    ]
    replication = plan.replication
    if not replication.checked:
        lines.append(
            f"{'no wait':8} {'':>14}    for replication (--no-wait-replication): replica "
            "regions may see the manifest before its files"
        )
    elif replication.keys:
        lines.append(
            f"{'wait':8} {len(replication.keys):>14,d} files until replicated to every "
            f"destination (rules {', '.join(replication.rules)}), then the manifest"
        )
    else:
        lines.append(
            f"{'no wait':8} {'':>14}    no replication rule of s3://{plan.bucket} covers "
            f"{plan.prefix}"
        )
    lines.append(f"{'manifest':8} {'':>14}    s3://{plan.bucket}/{plan.manifest_key}  (last)")
    lines.append(f"total to send: {plan.bytes_to_send:,d} bytes")
    return "\n".join(lines)


def _check_local(folder: Path, entry: FileEntry) -> None:
    actual = file_entry(folder / entry.path, entry.path)
    if (actual.size, actual.sha256) != (entry.size, entry.sha256):
        raise PublishError(
            f"checksum mismatch for {entry.path}: local sha256 {actual.sha256} ({actual.size} "
            f"bytes), the manifest says {entry.sha256} ({entry.size} bytes); nothing was made "
            "visible: rebuild the package"
        )


class _Uploader:
    """Uploads one plan with a shared thread pool; reports sent bytes to ``progress``."""

    def __init__(
        self, client: Any, folder: Path, plan: PublishPlan, workers: int, progress: Progress | None
    ) -> None:
        self.client, self.folder, self.plan = client, folder, plan
        self._workers = workers
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="publish")
        self._progress = progress
        self._lock = threading.Lock()

    def sent(self, n: int) -> None:
        if self._progress is not None:
            with self._lock:
                self._progress(n)

    def run(self) -> None:
        try:
            for item in self.plan.items:
                for upload_id in item.stale_uploads:
                    logger.warning(
                        "s3://%s/%s: aborting multipart upload %s (no upload record explains it: "
                        "left open by an earlier publish)",
                        self.plan.bucket,
                        item.key,
                        upload_id,
                    )
                    self._abort(item.key, upload_id)
                if item.action == "restart" and item.upload_id is not None:
                    logger.warning(
                        "s3://%s/%s: aborting multipart upload %s (%s); starting a fresh one",
                        self.plan.bucket,
                        item.key,
                        item.upload_id,
                        item.reason,
                    )
                    self._abort(item.key, item.upload_id)
            small = [i for i in self.plan.items if i.action != "skip" and not self._multipart(i)]
            futures = [self.pool.submit(self._put, item) for item in small]
            for item in self.plan.items:
                if item.action != "skip" and self._multipart(item):
                    self._upload_multipart(item)
            for future in futures:
                future.result()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def _multipart(self, item: PlanItem) -> bool:
        return item.action == "resume" or item.layout.count > 1

    def _abort(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.plan.bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:
            # Gone since planning (a lifecycle rule, another run): nothing left to abort.
            if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":
                raise

    def _put(self, item: PlanItem) -> None:
        path = self.folder / item.entry.path
        try:
            body = path.read_bytes()
        except OSError as exc:
            raise _unreadable(path, exc) from exc
        digest = hashlib.sha256(body)
        if digest.hexdigest() != item.entry.sha256:
            raise _changed(item.entry, digest.hexdigest(), len(body), "it was not uploaded")
        self.client.put_object(
            Bucket=self.plan.bucket,
            Key=item.key,
            Body=body,
            Metadata={_SHA_KEY: item.entry.sha256},
        )
        self.sent(len(body))

    def _upload_multipart(self, item: PlanItem) -> None:
        bucket, key, layout = self.plan.bucket, item.key, item.layout
        if item.action == "resume" and item.upload_id is not None:
            upload_id, kept = item.upload_id, dict(item.kept_parts)
        else:
            upload_id = self.client.create_multipart_upload(
                Bucket=bucket, Key=key, Metadata={_SHA_KEY: item.entry.sha256}
            )["UploadId"]
            # Cut short before this put, the upload has no record: the next run restarts it.
            record = _UploadRecord(upload_id, item.entry.sha256, layout.size, layout.part_size)
            self.client.put_object(
                Bucket=bucket,
                Key=_record_key(self.plan.prefix, item.entry),
                Body=json.dumps(asdict(record)).encode(),
                ContentType="application/json",
            )
            kept = {}
        parts = self._send_parts(item, upload_id, kept)
        self.client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
        )

    def _send_parts(
        self, item: PlanItem, upload_id: str, kept: dict[int, str]
    ) -> list[dict[str, Any]]:
        """Read the file once, in order, hashing it while the pool sends the parts; returns the
        parts to complete the upload with, or aborts it if the bytes are not the manifest's."""
        path, layout = self.folder / item.entry.path, item.layout
        digest = hashlib.sha256()
        size = 0
        # Bounds the parts read but not yet sent, so memory stays at ``workers`` parts.
        slots = threading.BoundedSemaphore(self._workers)
        stop = threading.Event()  # a part failed: read no further

        def done(future: Future[str]) -> None:
            if future.exception() is not None:
                stop.set()
            slots.release()

        futures: dict[int, Future[str]] = {}
        try:
            with path.open("rb") as handle:
                for number in range(1, layout.count + 1):
                    slots.acquire()
                    if stop.is_set():
                        break
                    data = handle.read(layout.length(number))
                    digest.update(data)
                    size += len(data)
                    futures[number] = self.pool.submit(
                        self._part, data, item.key, upload_id, number, kept
                    )
                    futures[number].add_done_callback(done)
        except OSError as exc:
            raise _unreadable(path, exc) from exc
        finally:
            wait(futures.values())
        parts = [{"PartNumber": n, "ETag": f.result()} for n, f in futures.items()]
        if digest.hexdigest() != item.entry.sha256:
            # Every part has been sent by now, so the abort leaves none behind.
            self.client.abort_multipart_upload(
                Bucket=self.plan.bucket, Key=item.key, UploadId=upload_id
            )
            raise _changed(item.entry, digest.hexdigest(), size, "its multipart upload was aborted")
        return parts

    def _part(
        self, data: bytes, key: str, upload_id: str, number: int, kept: dict[int, str]
    ) -> str:
        if number in kept:
            md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
            if kept[number] == md5:
                self.sent(len(data))  # already in S3 from an earlier, interrupted run
                return f'"{md5}"'
        response = self.client.upload_part(
            Bucket=self.plan.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
        )
        self.sent(len(data))
        return response["ETag"]


def _unreadable(path: Path, exc: OSError) -> PublishError:
    return PublishError(f"cannot read {path}: {exc.strerror}; run publish again")


def _changed(entry: FileEntry, sha256: str, size: int, what: str) -> PublishError:
    return PublishError(
        f"{entry.path} changed while it was published: the bytes read for upload have sha256 "
        f"{sha256} ({size:,d} bytes), the manifest says {entry.sha256} ({entry.size:,d} bytes); "
        f"{what} and the manifest was not written: stop whatever writes to it (the version "
        "folder hard-links the source tree's weights) and rebuild the package"
    )


def _remove_records(client: Any, plan: PublishPlan) -> None:
    """Delete the upload records of the version's files; run before the manifest makes it
    visible. Only those keys: `plan_publish` refuses files under the records folder, and
    anything else found there is not publish's."""
    records = {_record_key(plan.prefix, item.entry) for item in plan.items}
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=plan.bucket, Prefix=plan.prefix + _RECORDS):
        for obj in page.get("Contents", []):
            if obj["Key"] in records:
                client.delete_object(Bucket=plan.bucket, Key=obj["Key"])


def _check_remote(client: Any, plan: PublishPlan) -> None:
    for item in plan.items:
        head = _head(client, plan.bucket, item.key)
        remote_sha = None if head is None else head.get("Metadata", {}).get(_SHA_KEY)
        size = None if head is None else head["ContentLength"]
        if (remote_sha, size) != (item.entry.sha256, item.entry.size):
            raise PublishError(
                f"checksum mismatch for s3://{plan.bucket}/{item.key} after upload (sha256 "
                f"{remote_sha}, {size} bytes; expected {item.entry.sha256}, {item.entry.size} "
                "bytes); the manifest was not written: run publish again"
            )


def _wait_replicated(
    client: Any,
    plan: PublishPlan,
    timeout: float,
    backoff: Backoff,
    on_replication: Callable[[ReplicationProgress], None] | None,
) -> None:
    """Poll HeadObject until every covered file is at every destination; raises `PublishError`
    on a FAILED file, on one S3 will never replicate, or once ``timeout`` seconds have passed."""
    bucket, prefix = plan.bucket, plan.prefix
    pending = list(plan.replication.keys)
    deadline = time.monotonic() + timeout
    delay = backoff.first
    while True:
        statuses: dict[str, str | None] = {}
        for key in pending:
            head = _head(client, bucket, key)
            if head is None:
                raise PublishError(
                    f"s3://{bucket}/{key} disappeared while waiting for its replication; the "
                    "manifest was not written: run publish again"
                )
            statuses[key] = head.get("ReplicationStatus")
        _refuse_unreplicable(bucket, prefix, statuses, plan.replication.rules)
        pending = [k for k, status in statuses.items() if status == "PENDING"]
        total = len(plan.replication.keys)
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
                f"still PENDING: {_names(progress.pending)}; the manifest was not written: run "
                "publish again to keep waiting (uploaded files are skipped) or raise "
                "--replication-timeout; if it stays PENDING, check the replication rules' "
                "destinations and role"
            )
        time.sleep(min(delay, left))
        delay = min(2 * delay, backoff.most)


def publish(
    client: Any,
    folder: Path,
    bucket: str,
    *,
    root: str = "models",
    dry_run: bool = False,
    workers: int = 8,
    part_size: int = DEFAULT_PART_SIZE,
    progress: Progress | None = None,
    on_plan: Callable[[PublishPlan], None] | None = None,
    wait_replication: bool = True,
    replication_timeout: float = DEFAULT_REPLICATION_TIMEOUT,
    backoff: Backoff = Backoff(),
    on_replication: Callable[[ReplicationProgress], None] | None = None,
) -> PublishPlan:
    """Publish ``folder`` (a built version) to ``bucket``; returns the plan it carried out.

    With ``wait_replication``, the manifest is written only once every file a replication rule
    of the bucket covers is at every destination, waiting up to ``replication_timeout`` seconds.
    """
    try:
        plan = plan_publish(client, folder, bucket, root, part_size, wait_replication)
    except PackageError as exc:
        raise PublishError(str(exc)) from exc
    if on_plan is not None:
        on_plan(plan)
    if dry_run:
        return plan
    if not wait_replication:
        logger.warning(
            "not waiting for replication (--no-wait-replication): if s3://%s replicates %s, "
            "replica regions may see the manifest before the files it lists",
            bucket,
            plan.prefix,
        )
    for item in plan.items:
        if item.action != "skip":
            _check_local(folder, item.entry)
    _Uploader(client, folder, plan, workers, progress).run()
    _check_remote(client, plan)
    _remove_records(client, plan)
    if plan.replication.keys:
        _wait_replicated(client, plan, replication_timeout, backoff, on_replication)
    # The planned bytes, not the file as it is now: they list exactly what was uploaded and
    # checked above, so the visible manifest never names a file the bucket does not hold.
    client.put_object(
        Bucket=bucket,
        Key=plan.manifest_key,
        Body=plan.manifest_body,
        Metadata={_SHA_KEY: plan.manifest_sha256},
        ContentType="application/json",
    )
    return plan


def run_publish(
    folder: Path,
    bucket: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    dry_run: bool = False,
    workers: int = 8,
    part_size: int = DEFAULT_PART_SIZE,
    wait_replication: bool = True,
    replication_timeout: float = DEFAULT_REPLICATION_TIMEOUT,
    echo: Callable[[str], object] = print,
) -> PublishPlan:
    """``llm-serving publish``: a boto3 client, the plan printed, a progress bar with throughput,
    then a line whenever the wait for replication moves on."""
    import contextlib

    import boto3
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    try:
        client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
    except (BotoCoreError, ValueError) as exc:  # a malformed region or endpoint URL
        raise PublishError(
            f"cannot create the S3 client: {str(exc).rstrip('.')}; check --region (AWS_REGION) and "
            "--endpoint-url (AWS_ENDPOINT_URL)"
        ) from exc
    bar = Progress(
        "{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(),
    )  # fmt: skip
    task = bar.add_task("upload", total=None)

    def show_plan(plan: PublishPlan) -> None:
        echo(format_plan(plan))
        bar.update(task, total=plan.bytes_to_send)

    shown: list[ReplicationProgress] = []

    def show_replication(poll: ReplicationProgress) -> None:
        if shown[-1:] != [poll]:  # a line when a file's status changes, not one per poll
            bar.console.print(str(poll), soft_wrap=True, markup=False, highlight=False)
            shown.append(poll)

    try:
        with bar if not dry_run else contextlib.nullcontext():
            return publish(
                client,
                folder,
                bucket,
                dry_run=dry_run,
                workers=workers,
                part_size=part_size,
                progress=lambda n: bar.advance(task, n),
                on_plan=show_plan,
                wait_replication=wait_replication,
                replication_timeout=replication_timeout,
                on_replication=show_replication,
            )
    except (BotoCoreError, ClientError) as exc:
        raise PublishError(
            f"S3 refused or failed: {exc}; check credentials, the bucket name and the region "
            "(run again to resume)"
        ) from exc
