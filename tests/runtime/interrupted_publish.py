"""A publish cut short once its first multipart part is in S3, for the resume tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from operations.publish import publish

#: The part size the publish tests use (S3's minimum).
PART = 5 << 20


class Interrupted(Exception):
    """Raised from the progress callback to cut an upload short."""


def publish_cut_after_first_part(client: Any, version: Path, bucket: str) -> set[int]:
    """Publish until the first part is in S3, then stop; returns the parts kept there."""
    sent = 0

    def cut_after_first_part(n: int) -> None:
        nonlocal sent
        sent += n
        if sent >= PART:
            raise Interrupted

    with pytest.raises(Interrupted):
        publish(client, version, bucket, part_size=PART, workers=1, progress=cut_after_first_part)
    (upload,) = client.list_multipart_uploads(Bucket=bucket)["Uploads"]
    listed = client.list_parts(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    return {part["PartNumber"] for part in listed.get("Parts", [])}
