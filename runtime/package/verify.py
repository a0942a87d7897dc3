"""``llm-serving package verify|inspect``: check a version folder against its manifest."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from runtime.package.archive import (
    ArchiveFile,
    UnpackLimits,
    check_archive,
    read_member,
    shown_path,
)
from runtime.package.build import check_catalog, image_pins
from runtime.package.errors import PackageError
from runtime.package.manifest import MANIFEST_NAME, FileEntry, Manifest, load_manifest
from runtime.package.plugin_checks import check_plugin_entry_points, check_plugin_files, known_image
from runtime.package.repository import check_model_file
from runtime.package.tensors import check_python_model
from runtime.package.wheels import check_against_pins, read_wheel

__all__ = ["check_file", "describe", "unlisted_weight_files", "verify_archive", "verify_package"]

_CHUNK = 1 << 20


def check_file(folder: Path, entry: FileEntry, *, full: bool = True) -> None:
    """Raise `PackageError` unless ``folder / entry.path`` has the manifest's size (and sha256)."""
    _check_file(folder, entry, full, lambda: False)


class _Abandoned(Exception):
    """A check stopped half-way because a file listed before it had already failed."""


def _check_file(folder: Path, entry: FileEntry, full: bool, abandoned: Callable[[], bool]) -> None:
    path = folder / entry.path
    try:
        info = path.stat()
    except OSError as exc:
        raise PackageError(f"{entry.path} is missing from {folder}: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise PackageError(
            f"{entry.path} in {folder} is not a regular file; publish or restore it again"
        )
    size = info.st_size
    if size != entry.size:
        raise PackageError(
            f"{entry.path} is {size} bytes, the manifest says {entry.size}; the copy is "
            "incomplete or altered: publish or restore it again"
        )
    if full:
        try:
            actual = _sha256(path, abandoned)
        except OSError as exc:
            raise PackageError(
                f"cannot read {entry.path} in {folder}: {exc.strerror or exc}; fix its "
                "permissions or storage, or publish or restore it again"
            ) from exc
        if actual != entry.sha256:
            raise PackageError(
                f"checksum mismatch for {entry.path}: sha256 {actual}, the manifest says "
                f"{entry.sha256}; the copy is corrupt: publish or restore it again"
            )


def _sha256(path: Path, abandoned: Callable[[], bool]) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            # Asked between chunks, so a failure elsewhere stops a multi-GiB shard within 1 MiB.
            if abandoned():
                raise _Abandoned(path)
            digest.update(chunk)
    return digest.hexdigest()


class _FirstFailure:
    """The manifest position of the first file known to have failed its check."""

    def __init__(self, count: int) -> None:
        self._lock = threading.Lock()
        self.index = count

    def record(self, index: int) -> None:
        with self._lock:
            self.index = min(self.index, index)


def _check_files(folder: Path, entries: Sequence[FileEntry], full: bool, jobs: int) -> None:
    """`check_file` on ``entries``, ``jobs`` at a time; raises the error of the first failing
    entry in their order, as checking them one after the other would."""
    first_failure = _FirstFailure(len(entries))

    def check(index: int, entry: FileEntry) -> None:
        try:
            # A file after the first known failure cannot change which error is raised.
            _check_file(folder, entry, full, lambda: index > first_failure.index)
        except Exception:
            first_failure.record(index)
            raise

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="package-verify")
    try:
        futures = [pool.submit(check, index, entry) for index, entry in enumerate(entries)]
        # In manifest order, whichever failed first in time: every file before the one whose
        # error is raised has passed, so the outcome does not depend on the thread timing.
        for future in futures:
            future.result()
    finally:
        # On a failure (or an interrupt), running checks stop at their next chunk and queued
        # ones never start; after success this changes nothing.
        first_failure.record(-1)
        pool.shutdown(wait=True, cancel_futures=True)


def verify_archive(
    archive: Path,
    manifest: Manifest,
    *,
    full: bool = True,
    constraints: Path | None = None,
    limits: UnpackLimits | None = None,
) -> None:
    """Check every member as the entrypoint's unpack does (`check_archive`, whether ``full``
    or not), hash each file against ``archive_files`` when ``full``, and check the plugin
    wheels and catalogs it ships as packaging and the engine read them."""
    try:
        handle = archive.open("rb")
    except OSError as exc:
        raise _unreadable(archive, exc) from exc
    with handle:
        files = check_archive(handle, str(archive), manifest.archive_files, limits)
        by_path = {member.path: member for member in files}
        if full:
            expected = {entry.path: entry.sha256 for entry in manifest.archive_files}
            for member in files:
                digest = _member_sha256(handle, archive, member)
                if digest != expected[member.path]:
                    raise PackageError(
                        f"checksum mismatch for archive member {shown_path(member.path)}; "
                        "rebuild the package"
                    )
        # check_archive found every archive_files entry, and the manifest's own checks put
        # each plugin wheel and catalog among them.
        wheels = [read_member(handle, str(archive), by_path[p.wheel]) for p in manifest.plugins]
        catalogs = [read_member(handle, str(archive), by_path[c.path]) for c in manifest.catalogs]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            _check_plugins(Path(tmp), manifest, wheels, constraints)
            for i, (catalog, data) in enumerate(zip(manifest.catalogs, catalogs, strict=True)):
                path = Path(tmp) / f"{i}.jsonl"
                path.write_bytes(data)
                check_catalog(path, catalog, f"catalogs.{i}")
    except OSError as exc:
        raise _unreadable(archive, exc) from exc


def _member_sha256(handle: BinaryIO, archive: Path, member: ArchiveFile) -> str:
    digest = hashlib.sha256()
    done = 0
    while done < member.size:
        part = ArchiveFile(member.path, member.offset + done, min(_CHUNK, member.size - done))
        digest.update(read_member(handle, str(archive), part))
        done += part.size
    return digest.hexdigest()


def _unreadable(archive: Path, exc: OSError) -> PackageError:
    # str(exc), not strerror: a failure writing the temporary copy names that file instead.
    return PackageError(
        f"reading archive {archive} failed: {exc}; fix its permissions or storage, or publish "
        "or restore it again"
    )


def _check_plugins(
    tmp: Path, manifest: Manifest, wheels: list[bytes], constraints: Path | None
) -> None:
    image = image_pins(manifest.triton, constraints)
    names = known_image(image.distributions)
    infos = []
    for i, (plugin, data) in enumerate(zip(manifest.plugins, wheels, strict=True)):
        path = tmp / f"{i}" / Path(plugin.wheel).name
        path.parent.mkdir()
        path.write_bytes(data)
        info = read_wheel(path, plugin.wheel)
        if (info.distribution, info.version) != (plugin.distribution, plugin.version):
            raise PackageError(
                f"plugin wheel {plugin.wheel} is {info.distribution} {info.version}, the "
                f"manifest says {plugin.distribution} {plugin.version}"
            )
        check_against_pins(info, plugin.wheel, image.pins, image.environment, image.ranges)
        check_plugin_files(info, plugin.wheel, names, set(image.pins))
        infos.append((plugin.wheel, info))
    check_plugin_entry_points(infos, image.environment)


def unlisted_weight_files(folder: Path, manifest: Manifest) -> list[str]:
    """Paths under the weights folder, relative to ``folder``, that ``weight_files`` lacks.

    vLLM loads every weight file of the folder it is given, not the manifest's list, so one
    left there (an earlier build's shard under a republished prefix) would be served unverified.
    """
    listed = {entry.path for entry in manifest.weight_files}
    found = []

    def failed(exc: OSError) -> None:
        raise exc  # an unreadable folder could hide a file: refuse rather than guess

    for top, dirs, files in os.walk(folder / manifest.weights, onerror=failed):
        # A link to a folder is not walked into (it may lead anywhere), but it is no listed file.
        names = [*files, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]
        for name in names:
            path = Path(top, name).relative_to(folder).as_posix()
            if path not in listed:
                found.append(path)
    return sorted(found)


def _shown(paths: list[str], limit: int = 10) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def verify_package(
    folder: Path,
    *,
    full: bool = True,
    constraints: Path | None = None,
    limits: UnpackLimits | None = None,
    jobs: int = 1,
) -> Manifest:
    """Check a version folder: checksums (sizes only unless ``full``; ``jobs`` files at once),
    every archive member as the entrypoint's unpack checks it (under ``limits``, default the
    pod's), plugins, catalogs (as the engine reads them), tensors (a non-LLM model's read again
    from its file)."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    manifest = load_manifest(folder / MANIFEST_NAME)
    _check_files(folder, [manifest.archive, *manifest.weight_files], full, jobs)
    if unlisted := unlisted_weight_files(folder, manifest):
        raise PackageError(
            f"{folder / manifest.weights} holds {_shown(unlisted)}, which {MANIFEST_NAME} does "
            "not list; vLLM loads every weight file there: delete them, or build and publish "
            "the version again as a new model_version"
        )
    archive = folder / manifest.archive.path  # the file whose checksum was just checked
    verify_archive(archive, manifest, full=full, constraints=constraints, limits=limits)
    if manifest.python_model is not None:
        check_python_model(manifest.python_model)
    for model in manifest.models:
        check_model_file(folder, model)
    return manifest


def describe(folder: Path) -> dict[str, Any]:
    """A summary of a version folder's manifest for ``package inspect``."""
    manifest = load_manifest(folder / MANIFEST_NAME if folder.is_dir() else folder)
    return {
        "model": f"{manifest.model_id}/{manifest.model_version}",
        "format_version": manifest.format_version,
        "backend": manifest.backend,
        "serving_mode": manifest.serving_mode,
        "triton": manifest.triton,
        "engine_args": manifest.engine_args,
        "plugins": [f"{p.distribution}=={p.version} ({p.wheel})" for p in manifest.plugins],
        "catalogs": [c.name for c in manifest.catalogs],
        "models": [f"{m.name} ({m.backend})" for m in manifest.models],
        "archive_files": len(manifest.archive_files),
        "archive_bytes": manifest.archive.size,
        "weight_files": len(manifest.weight_files),
        "weight_bytes": sum(e.size for e in manifest.weight_files),
    }
