"""Stages 1, 2, 4 and 5 of the start-up: locate and verify, unpack, wipe metrics, check the pair."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeGuard
from urllib.parse import urlparse

from pydantic import ValidationError

from runtime.compat import (
    CompatError,
    CompatPair,
    check_vllm_version,
    installed_vllm_version,
    load_matrix,
)
from runtime.entrypoint.errors import StageFailed
from runtime.package.archive import UnpackLimits
from runtime.package.errors import PackageError
from runtime.package.manifest import MANIFEST_NAME, Manifest, load_manifest
from runtime.package.unpack import unpack_archive
from runtime.package.verify import check_file, unlisted_weight_files

__all__ = [
    "check_compat",
    "download_version",
    "locate",
    "release_pair",
    "start_import_probe",
    "unpack",
    "wipe_multiproc_dir",
]

#: What a write to the work dir fails with when the disk, not the package, is at fault.
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
_WORK_DIR_FIX = "mount a writable emptyDir at LLM_SERVING_WORK_DIR"


def _disk_fault(exc: BaseException | None, folder: Path) -> TypeGuard[OSError]:
    """Whether ``exc`` is the work dir refusing a write into ``folder``: full, over quota or
    read-only anywhere, or permission denied on a file in ``folder`` (the same errno for a file
    elsewhere, such as a credentials or token file, is not the work dir's fault)."""
    if not isinstance(exc, OSError):
        return False
    if exc.errno in _DISK_ERRNOS:
        return True
    return (
        exc.errno == errno.EACCES
        and exc.filename is not None
        and folder in Path(os.fsdecode(exc.filename)).parents
    )


def _work_dir_fix(manifest: Manifest | None, *, downloaded: bool) -> str:
    """The fix for a full or read-only work dir: the room the package takes there, once the
    manifest has said it (the download, if the package was downloaded, and then the unpacked
    archive)."""
    fix = f"{_WORK_DIR_FIX} with room for the package"
    if manifest is None:
        return fix
    unpacked = sum(entry.size for entry in manifest.archive_files)
    if not downloaded:
        return f"{fix} ({unpacked} bytes unpacked)"
    download = manifest.archive.size + sum(entry.size for entry in manifest.weight_files)
    return f"{fix} ({download} bytes downloaded, then {unpacked} bytes unpacked)"


def _fresh_folder(path: Path, what: str, fix: str) -> None:
    """Empty ``path`` (the work dir outlives container restarts, and with it whatever a start
    that was cut short left there) and create it, failing with ``fix`` if the disk refuses."""
    try:
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
    except OSError as exc:
        raise StageFailed(f"cannot prepare the {what} {path}: {exc.strerror or exc}", fix) from exc


def download_version(uri: str, target: Path) -> Path:
    """Copy ``s3://bucket/prefix/`` (manifest first, to learn the files; verified afterwards)."""
    import boto3

    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise StageFailed(
            f"LLM_SERVING_PACKAGE_S3_URI {uri!r} is not s3://bucket/prefix/",
            "set it to s3://<bucket>/models/<id>/<version>/",
        )
    bucket, prefix = parsed.netloc, parsed.path.strip("/") + "/"
    client = boto3.client("s3")
    # s3transfer writes each file under a temporary name and renames it when complete: what a
    # restart cut short would otherwise be refused as an unlisted weight file, start after start.
    _fresh_folder(target, "download folder", _work_dir_fix(None, downloaded=True))
    manifest: Manifest | None = None
    try:
        client.download_file(bucket, prefix + MANIFEST_NAME, str(target / MANIFEST_NAME))
        manifest = load_manifest(target / MANIFEST_NAME)
        for entry in [manifest.archive, *manifest.weight_files]:
            (target / entry.path).parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, prefix + entry.path, str(target / entry.path))
    except (PackageError, StageFailed):
        raise
    except Exception as exc:  # botocore raises several unrelated types for one failed copy
        if _disk_fault(exc, target):
            # s3transfer re-raises the disk's OSError as it is: no fault of the bucket.
            raise StageFailed(
                f"cannot write the download folder {target}: {exc.strerror or exc}",
                _work_dir_fix(manifest, downloaded=True),
            ) from exc
        raise StageFailed(
            f"cannot download {uri}: {exc}",
            "check the bucket, the prefix and the pod's S3 permissions",
        ) from exc
    return target


def locate(
    package_path: Path | None,
    s3_uri: str | None,
    download_dir: Path,
    *,
    verify_weights: bool,
    expect: tuple[str | None, str | None],
    warn: Callable[[str], None],
) -> tuple[Path, Manifest]:
    """Find the version folder (model cache, else S3) and verify its checksums (the weights'
    sha256 when ``verify_weights`` or downloaded, else their sizes)."""
    folder: Path | None = None
    downloaded = False
    if package_path is not None and (package_path / MANIFEST_NAME).is_file():
        folder = package_path
    elif s3_uri:
        downloaded = True
        where = "no model cache path is set" if package_path is None else f"{package_path}"
        warn(
            f"package not found on the model cache ({where}); downloading {s3_uri}: "
            "cold start will be slow"
        )
        folder = download_version(s3_uri, download_dir)
    elif package_path is None:
        raise StageFailed(
            "no model package is configured (LLM_SERVING_PACKAGE_PATH is not set, nor both "
            "LLM_SERVING_MODEL_ID and LLM_SERVING_MODEL_VERSION)",
            "set LLM_SERVING_PACKAGE_PATH to the version folder, or LLM_SERVING_MODEL_ID and "
            "LLM_SERVING_MODEL_VERSION to find it under LLM_SERVING_MODEL_CACHE_ROOT",
        )
    else:
        raise StageFailed(
            f"no {MANIFEST_NAME} in {package_path} (LLM_SERVING_PACKAGE_PATH, or "
            "LLM_SERVING_MODEL_CACHE_ROOT/<model id>/<model version>) and no "
            "LLM_SERVING_PACKAGE_S3_URI fallback",
            "publish the version and wait for the model cache restore Job, or set the S3 URI",
        )
    try:
        manifest = load_manifest(folder / MANIFEST_NAME)
    except PackageError as exc:
        if not isinstance(exc.__cause__, ValidationError):
            raise  # unreadable: the stage's own fix (republish, restore) applies
        raise StageFailed(
            str(exc),
            "fix the value in package.yaml and rebuild with llm-serving package build, which "
            "refuses such a manifest, then publish it as a new model_version",
        ) from exc
    want_id, want_version = expect
    if (want_id and want_id != manifest.model_id) or (
        want_version and want_version != manifest.model_version
    ):
        raise StageFailed(
            f"package at {folder} is {manifest.model_id}/{manifest.model_version}, the pod "
            f"expects {want_id}/{want_version}",
            "point LLM_SERVING_PACKAGE_PATH at the version this deployment serves",
        )
    check_file(folder, manifest.archive, full=True)
    # The materialize Job's verify container hashed the model cache's copy against this
    # manifest before any server of the version was scheduled; a fresh download nobody has.
    for entry in manifest.weight_files:
        check_file(folder, entry, full=verify_weights or downloaded)
    _refuse_unlisted_weights(folder, manifest)
    return folder, manifest


def _refuse_unlisted_weights(folder: Path, manifest: Manifest) -> None:
    """Refuse files in the weights folder that the manifest does not list.

    vLLM loads every weight file of the folder it is given, not the manifest's list, so an
    earlier build's shard left under the version's prefix (and imported to the model cache
    with it) would be loaded beside the verified ones.
    """
    unlisted = unlisted_weight_files(folder, manifest)
    if not unlisted:
        return
    shown = ", ".join(unlisted[:10])
    if len(unlisted) > 10:
        shown += f" and {len(unlisted) - 10} more"
    raise StageFailed(
        f"the weights folder {manifest.weights}/ of {folder} holds {shown}, which the manifest "
        "does not list; vLLM loads every weight file there, so they would be served unverified",
        f"delete them from s3://<bucket>/models/{manifest.model_id}/{manifest.model_version}/ "
        "and from the model cache (or publish the build as a new model_version)",
    )


def unpack(folder: Path, manifest: Manifest, dest: Path, max_bytes: int) -> Path:
    """Unpack the (already verified) archive to fresh local disk."""
    # The archive's sha256 was checked in stage 1 from the same read-only mount, so the member
    # checks here are structural (names, types, sizes) and the copy stays in the kernel. It is
    # the file the manifest names, as there: a different file would be unpacked unverified.
    fix = _work_dir_fix(manifest, downloaded=False)
    _fresh_folder(dest, "unpack folder", fix)
    try:
        unpack_archive(
            folder / manifest.archive.path,
            manifest.archive_files,
            dest,
            UnpackLimits(max_total_bytes=max_bytes),
        )
    except PackageError as exc:
        # A full or read-only work dir is no fault of the package: republishing would not help.
        if _disk_fault(exc.__cause__, dest):
            raise StageFailed(str(exc), fix) from exc
        raise
    return dest


def wipe_multiproc_dir(path: Path | None) -> int:
    """Delete the ``*.db`` files prometheus_client left in PROMETHEUS_MULTIPROC_DIR; returns
    how many.

    Only those: they are all that its readers (and the metrics proxy) merge, so nothing else
    there can skew a metric, and whatever else is there is not ours to delete.
    """
    if path is None:
        raise StageFailed(
            "PROMETHEUS_MULTIPROC_DIR is not set",
            "set it to the emptyDir shared with the metrics proxy "
            "(/var/run/llm-serving/prometheus)",
        )
    removed = 0
    try:
        path.mkdir(parents=True, exist_ok=True)
        for entry in path.iterdir():
            if entry.suffix != ".db":
                continue
            if entry.is_dir() and not entry.is_symlink():
                raise StageFailed(
                    f"PROMETHEUS_MULTIPROC_DIR {path} holds a folder {entry.name}, which "
                    "prometheus_client would read as a metrics file",
                    "remove it, or point PROMETHEUS_MULTIPROC_DIR at an emptyDir of its own",
                )
            entry.unlink()
            removed += 1
    except OSError as exc:
        raise StageFailed(
            f"cannot wipe PROMETHEUS_MULTIPROC_DIR {path}: {exc}",
            "mount a writable emptyDir there",
        ) from exc
    return removed


def start_import_probe(
    release: str | None, matrix_path: Path | None, env: dict[str, str] | None = None
) -> subprocess.Popen[str] | None:
    """Start importing the pair's backend modules in a separate interpreter, right away.

    vLLM takes seconds to import; started early, the probe overlaps the other stages and
    `check_compat` only collects its result. ``env`` is the probe's environment (default this
    process's). ``None`` when the pair is unknown (stage 5 then reports why).
    """
    if release is None:
        return None
    try:
        pair = load_matrix(matrix_path).for_triton(release)
        check_vllm_version(pair, installed_vllm_version())
    except CompatError:
        return None  # stage 5 reports it; no point importing a vLLM it will refuse
    return subprocess.Popen(
        [sys.executable, "-m", "runtime.compat", "probe", *pair.backend_modules],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def release_pair(release: str | None, matrix_path: Path | None) -> CompatPair:
    """The matrix's pair for ``release``, for a package that runs no vLLM (nothing to probe)."""
    if release is None:
        raise StageFailed(
            "the Triton release is unknown (NVIDIA_TRITON_SERVER_VERSION is not set)",
            "set LLM_SERVING_TRITON_RELEASE to the image's release, e.g. 26.08",
        )
    try:
        return load_matrix(matrix_path).for_triton(release)
    except CompatError as exc:
        raise StageFailed(str(exc), "use a serving image of a release in the matrix") from exc


def check_compat(
    release: str | None,
    matrix_path: Path | None,
    probe: subprocess.Popen[str] | None = None,
    env: dict[str, str] | None = None,
) -> CompatPair:
    """Check the installed vLLM against the matrix and import-probe the backend's modules;
    returns the pair (the render stage picks the vLLM backend from it)."""
    if release is None:
        raise StageFailed(
            "the Triton release is unknown (NVIDIA_TRITON_SERVER_VERSION is not set)",
            "set LLM_SERVING_TRITON_RELEASE to the image's release, e.g. 26.08",
        )
    try:
        pair = load_matrix(matrix_path).for_triton(release)
        check_vllm_version(pair, installed_vllm_version())
    except CompatError as exc:
        if probe is not None:
            probe.kill()
            probe.communicate()
        raise StageFailed(str(exc), "use the serving image built for this pair") from exc
    # A separate interpreter: vLLM's import cost and memory stay out of the entrypoint.
    if probe is None:
        probe = start_import_probe(release, matrix_path, env)
    assert probe is not None  # the pair resolved above
    stdout, stderr = probe.communicate()
    if probe.returncode != 0:
        lines = stdout.strip().splitlines() or stderr.strip().splitlines()[-1:]
        module, _, error = (lines[0] if lines else "?").partition("\t")
        raise StageFailed(
            f"vLLM {pair.vllm} cannot import {module}, which the Triton {release} backend "
            f"needs: {error}",
            "rebuild the image: its vLLM does not match the backend",
        )
    return pair
