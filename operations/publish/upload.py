"""Publish's upload: parallel (multipart, resumable) uploads hashed as they are read, the checks
after them, the replication wait, and the manifest written last; ``run_publish`` is the command."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from operations.publish.planning import (
    DEFAULT_PART_SIZE,
    RECORDS_PREFIX,
    PlanItem,
    PublishPlan,
    UploadRecord,
    format_plan,
    plan_publish,
    record_key,
    refuse_unlisted,
)
from operations.publish.replication import (
    DEFAULT_REPLICATION_TIMEOUT,
    Backoff,
    ReplicationProgress,
    wait_replicated,
)
from operations.publish.s3 import SHA_KEY, PublishError, head_object
from runtime.package.build import file_entry
from runtime.package.errors import PackageError
from runtime.package.manifest import MANIFEST_NAME, FileEntry

__all__ = ["publish", "run_publish"]

Progress = Callable[[int], None]
_BACKOFF = Backoff()

logger = logging.getLogger(__name__)


def _check_local(folder: Path, entry: FileEntry) -> None:
    """Hash ``entry``'s file again just before the upload; runs before anything is sent."""
    path = folder / entry.path
    try:
        actual = file_entry(path, entry.path)
    except OSError as exc:  # gone or unreadable since planning (a rebuild, a clean-up)
        raise PublishError(
            f"cannot read {path}: {_reason(exc)} (it was readable when publish planned); nothing "
            "was uploaded and the manifest was not written: restore the file or rebuild the "
            "package (llm-serving package build), then run publish again"
        ) from exc
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
            for key, upload_id in self.plan.abandoned_uploads:
                logger.warning(
                    "s3://%s/%s: aborting multipart upload %s (%s does not list the file: left "
                    "open by an earlier publish of another build)",
                    self.plan.bucket,
                    key,
                    upload_id,
                    MANIFEST_NAME,
                )
                self._abort(key, upload_id)
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
            Metadata={SHA_KEY: item.entry.sha256},
        )
        self.sent(len(body))

    def _upload_multipart(self, item: PlanItem) -> None:
        bucket, key, layout = self.plan.bucket, item.key, item.layout
        if item.action == "resume" and item.upload_id is not None:
            upload_id, kept = item.upload_id, dict(item.kept_parts)
        else:
            upload_id = self.client.create_multipart_upload(
                Bucket=bucket, Key=key, Metadata={SHA_KEY: item.entry.sha256}
            )["UploadId"]
            # Cut short before this put, the upload has no record: the next run restarts it.
            record = UploadRecord(upload_id, item.entry.sha256, layout.size, layout.part_size)
            self.client.put_object(
                Bucket=bucket,
                Key=record_key(self.plan.prefix, item.entry.path),
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


def _reason(exc: OSError) -> str:
    """Why ``exc``'s read failed, in one line: the OS's words, without the path repeated."""
    return exc.strerror or " ".join(str(exc).split())


def _unreadable(path: Path, exc: OSError) -> PublishError:
    """The error for a read of ``path`` that failed while uploading it. The file's upload is not
    completed (a multipart one stays open, with its record) and the manifest is not written."""
    return PublishError(
        f"cannot read {path} while uploading it: {_reason(exc)}; the manifest was not written "
        "and what was uploaded is kept: restore the file or rebuild the package (llm-serving "
        "package build), then run publish again to resume"
    )


def _changed(entry: FileEntry, sha256: str, size: int, what: str) -> PublishError:
    return PublishError(
        f"{entry.path} changed while it was published: the bytes read for upload have sha256 "
        f"{sha256} ({size:,d} bytes), the manifest says {entry.sha256} ({entry.size:,d} bytes); "
        f"{what} and the manifest was not written: stop whatever writes to it (the version "
        "folder hard-links the source tree's weights) and rebuild the package"
    )


def _remove_records(client: Any, plan: PublishPlan) -> None:
    """Delete the upload records of the version's files and of the uploads aborted as abandoned;
    run before the manifest makes it visible. Only those keys: `plan_publish` refuses files under
    the records folder, and anything else found there is not publish's."""
    records = {record_key(plan.prefix, item.entry.path) for item in plan.items}
    records |= {
        record_key(plan.prefix, key.removeprefix(plan.prefix)) for key, _ in plan.abandoned_uploads
    }
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=plan.bucket, Prefix=plan.prefix + RECORDS_PREFIX):
        for obj in page.get("Contents", []):
            if obj["Key"] in records:
                client.delete_object(Bucket=plan.bucket, Key=obj["Key"])


def _check_remote(client: Any, plan: PublishPlan) -> None:
    for item in plan.items:
        head = head_object(client, plan.bucket, item.key)
        remote_sha = None if head is None else head.get("Metadata", {}).get(SHA_KEY)
        size = None if head is None else head["ContentLength"]
        if (remote_sha, size) != (item.entry.sha256, item.entry.size):
            raise PublishError(
                f"checksum mismatch for s3://{plan.bucket}/{item.key} after upload (sha256 "
                f"{remote_sha}, {size} bytes; expected {item.entry.sha256}, {item.entry.size} "
                "bytes); the manifest was not written: run publish again"
            )


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
    backoff: Backoff = _BACKOFF,
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
        wait_replicated(
            client,
            bucket,
            plan.prefix,
            plan.replication,
            replication_timeout,
            backoff,
            on_replication,
        )
    # Planning refused such keys already; this catches any that came while uploading, as the
    # manifest is what makes them part of a visible version.
    paths = [item.entry.path for item in plan.items]
    refuse_unlisted(client, bucket, plan.prefix, paths, "the manifest was not written")
    # The planned bytes, not the file as it is now: they list exactly what was uploaded and
    # checked above, so the visible manifest never names a file the bucket does not hold.
    client.put_object(
        Bucket=bucket,
        Key=plan.manifest_key,
        Body=plan.manifest_body,
        Metadata={SHA_KEY: plan.manifest_sha256},
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
    from botocore.config import Config
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    try:
        # A connection for each worker and one for the thread that opens and completes uploads:
        # botocore's default of 10 would make urllib3 discard (and log) one at every request.
        config = Config(max_pool_connections=workers + 1)
        client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
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
