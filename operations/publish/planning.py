"""Publish's plan: what each file of a built version needs (upload, resume, restart, replace or
skip), read from the bucket before anything is written."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from botocore.exceptions import ClientError

from operations.publish.replication import (
    NO_REPLICATION,
    Replication,
    refuse_unreplicable,
    replication_for,
)
from operations.publish.s3 import SHA_KEY, PublishError, head_object, listed, read_failed
from runtime.package.manifest import (
    MANIFEST_NAME,
    RECORDS_DIR,
    FileEntry,
    parse_manifest,
    read_manifest_bytes,
)

__all__ = [
    "DEFAULT_PART_SIZE",
    "RECORDS_PREFIX",
    "Action",
    "PartETags",
    "PartLayout",
    "PlanItem",
    "PublishPlan",
    "UploadRecord",
    "format_plan",
    "part_layout",
    "plan_publish",
    "record_key",
    "refuse_unlisted",
    "version_prefix",
]

DEFAULT_PART_SIZE = 64 << 20
# S3's multipart limits: parts of 5 MiB (but the last) to 5 GiB, 10,000 parts, 5 TiB objects.
_MIN_PART_SIZE = 5 << 20
_MAX_PART_SIZE = 5 << 30
_MAX_PARTS = 10_000
_MAX_OBJECT_SIZE = 5 << 40
RECORDS_PREFIX = f"{RECORDS_DIR}/"  # under the version prefix: one record per open upload
Action = Literal["upload", "resume", "restart", "replace", "skip"]
PartETags = tuple[tuple[int, str], ...]
"""``(part number, md5 hex)`` of the parts an open upload already holds."""


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
class UploadRecord:
    """What an open multipart upload was opened for, stored beside it as JSON."""

    upload_id: str
    sha256: str
    size: int
    part_size: int


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
    replication: Replication = NO_REPLICATION
    abandoned_uploads: tuple[tuple[str, str], ...] = ()
    """``(key, upload id)`` of open multipart uploads under the prefix for keys the manifest does
    not list (a publish cut short, then a rebuild that renamed or dropped the file): aborted
    before anything is sent, as S3 bills their parts and no object listing shows them."""

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


def record_key(prefix: str, path: str) -> str:
    """The key of the record beside the open multipart upload of the package's file ``path``."""
    return f"{prefix}{RECORDS_PREFIX}{path}.json"


def _read_record(client: Any, bucket: str, key: str) -> UploadRecord | None:
    """The record at ``key``, or None when there is none or it cannot be understood."""
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise read_failed(bucket, key, exc) from exc
    try:
        record = UploadRecord(**json.loads(body))
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
    record: UploadRecord | None,
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


def refuse_unlisted(client: Any, bucket: str, prefix: str, files: Iterable[str], done: str) -> None:
    """Raise `PublishError` if the version's prefix holds a key other than ``files`` (the paths
    the manifest lists), the manifest and publish's upload records.

    The model cache imports the whole prefix and vLLM loads every weight file of its folder, so
    a shard left by an earlier build of the version (a publish cut short before its manifest)
    would be served beside the new ones. Only publish's own records and the manifest itself are
    not files of the package, and folder markers (empty keys ending in ``/``, as the S3 console's
    "Create folder" writes), which the model cache imports as folders. ``done`` says what publish
    has and has not done so far.
    """
    wanted = {prefix + path for path in (*files, MANIFEST_NAME)}
    unlisted = []
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            key = obj["Key"]
            if key.endswith("/") and obj.get("Size") == 0:
                continue  # a folder marker: a folder in the model cache, no file to load
            if key not in wanted and not key.startswith(prefix + RECORDS_PREFIX):
                unlisted.append(key.removeprefix(prefix))
    if unlisted:
        # Refused rather than deleted: publish never removes what it cannot prove it wrote, and
        # its role's s3:DeleteObject is meant for its upload records.
        unlisted.sort()
        raise PublishError(
            f"s3://{bucket}/{prefix} holds {listed(unlisted)}, which {MANIFEST_NAME} does not "
            "list (left by an earlier build of this version, or put there by hand); the model "
            f"cache imports the whole prefix, so pods would load them; {done}: delete them "
            f"(aws s3 rm s3://{bucket}/{prefix}<file>, or aws s3 rm --recursive "
            f"s3://{bucket}/{prefix} to start the version over) and publish again"
        )


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
    reserved = [e.path for e in entries if e.path.startswith(RECORDS_PREFIX)]
    if reserved:
        raise PublishError(
            f"{listed(reserved)} in {folder} are under {RECORDS_PREFIX}, where publish keeps its "
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
    remote_manifest = head_object(client, bucket, manifest_key)
    local_manifest_sha = hashlib.sha256(manifest_body).hexdigest()
    if (
        remote_manifest is not None
        and remote_manifest.get("Metadata", {}).get(SHA_KEY) != local_manifest_sha
    ):
        raise PublishError(
            f"{manifest.model_id}/{manifest.model_version} is already published at "
            f"s3://{bucket}/{prefix} with another manifest; versions are immutable: "
            "build the package with a new model_version"
        )
    paths = [entry.path for entry in entries]
    refuse_unlisted(client, bucket, prefix, paths, "nothing was uploaded")
    open_uploads = _open_uploads(client, bucket, prefix)
    items = []
    skipped: dict[str, str | None] = {}  # key -> ReplicationStatus of the files kept as they are
    for entry in entries:
        key = prefix + entry.path
        layout = part_layout(entry.size, part_size)
        uploads = open_uploads.get(key, [])
        head = head_object(client, bucket, key)
        remote_sha = None if head is None else head.get("Metadata", {}).get(SHA_KEY)
        if head is None:
            item = PlanItem(key, entry, "upload", "not in the bucket", layout)
        elif remote_sha == entry.sha256 and head["ContentLength"] == entry.size:
            item = PlanItem(key, entry, "skip", "same sha256 already in the bucket", layout)
            skipped[key] = head.get("ReplicationStatus")
        else:
            item = PlanItem(key, entry, "replace", f"bucket has sha256 {remote_sha}", layout)
        if uploads and item.action != "skip":
            record = _read_record(client, bucket, record_key(prefix, entry.path))
            upload_id = uploads[-1]
            if record is not None and record.upload_id in uploads:
                upload_id = record.upload_id
            resumed = _resume_or_restart(client, bucket, key, entry, upload_id, record, layout)
            # A completed upload replaces the older build's object as a fresh one would.
            reason = resumed.reason if head is None else f"{item.reason}; {resumed.reason}"
            item = replace(resumed, reason=reason)
        items.append(_with_stale(item, uploads))
    # Uploads of keys no longer planned would stay open, and billed, forever: only a publish of
    # this version opens uploads under its prefix, and never under the records folder.
    planned = {item.key for item in items}
    abandoned = tuple(
        (key, upload_id)
        for key, upload_ids in sorted(open_uploads.items())
        if key not in planned and not key.startswith(prefix + RECORDS_PREFIX)
        for upload_id in upload_ids
    )
    replication = Replication(checked=False)
    if wait_replication:
        replication = replication_for(client, bucket, [item.key for item in items])
        statuses = {key: skipped[key] for key in replication.keys if key in skipped}
        refuse_unreplicable(bucket, prefix, statuses, replication.rules)
    return PublishPlan(
        bucket,
        tuple(items),
        manifest_key,
        manifest_body,
        local_manifest_sha,
        replication,
        abandoned,
    )


def format_plan(plan: PublishPlan) -> str:
    """The plan as printed by ``--dry-run``: one line per file, the wait for replication, the
    manifest last."""
    lines = [
        f"{item.action:8} {item.entry.size:>14,d} B  s3://{plan.bucket}/{item.key}  ({item.reason})"
        for item in plan.items
    ]
    lines += [
        f"{'abort':8} {'':>14}    s3://{plan.bucket}/{key}  (open multipart upload {upload_id} "
        f"of a file {MANIFEST_NAME} does not list)"
        for key, upload_id in plan.abandoned_uploads
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
