"""``llm-serving publish``: upload a built version folder to the regional model bucket.

Planning (:mod:`.planning`), the upload (:mod:`.upload`) and the replication wait
(:mod:`.replication`) are separate modules; this package exports what callers use.

Objects land under ``models/<model_id>/<model_version>/`` with their sha256 in the object
metadata. Large files go up as parallel multipart uploads that a later run resumes (it finds the
open upload in S3 and keeps every part whose ETag matches), files already there with the same
checksum are skipped, and ``manifest.json`` is written last, so a reader that finds the manifest
finds every file it lists. Before uploading, and again before the manifest, it refuses any other
key under the prefix (an earlier build's file left by a publish cut short before its manifest):
the model cache imports the whole prefix and vLLM loads every weight file it finds there.

The bucket's Cross-Region Replication copies each object on its own and in no order, so where a
rule covers the version, publish first waits until S3 reports every file (uploaded now or already
there) ``COMPLETED`` at every destination; a replica region then never sees a manifest early.

S3 cannot return the metadata of an open multipart upload, so each one gets a small record
object under ``<version>/.publish/`` saying which content (sha256, size) and part size it was
opened for; a resume that finds another content, or no record, aborts the upload and starts
again, and any other open upload of the key is aborted as left behind by an earlier run, as is
any open upload under the prefix of a key the manifest does not list. The records are removed
before the manifest is written, which is why packages may not keep files there.

Each file is hashed again while it is read for upload (not read twice), so a file rewritten after
the checks is never stored under the manifest's sha256: its upload is refused or aborted. The
manifest is read once, when planning, and those very bytes are what publish writes last.
"""

from operations.publish.planning import (
    DEFAULT_PART_SIZE,
    PartLayout,
    PlanItem,
    PublishPlan,
    format_plan,
    part_layout,
    plan_publish,
    version_prefix,
)
from operations.publish.replication import (
    DEFAULT_REPLICATION_TIMEOUT,
    Backoff,
    Replication,
    ReplicationProgress,
)
from operations.publish.s3 import PublishError
from operations.publish.upload import publish, run_publish

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
