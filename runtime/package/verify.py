"""``llm-serving package verify|inspect``: check a version folder against its manifest."""

from __future__ import annotations

import hashlib
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from runtime.package.build import check_catalog, file_entry, image_pins
from runtime.package.errors import PackageError
from runtime.package.manifest import MANIFEST_NAME, FileEntry, Manifest, load_manifest
from runtime.package.plugin_checks import check_plugin_entry_points, check_plugin_files, known_image
from runtime.package.tensors import check_python_model
from runtime.package.unpack import check_member, open_archive
from runtime.package.wheels import check_against_pins, read_wheel

__all__ = ["check_file", "describe", "verify_archive_members", "verify_package"]

_CHUNK = 1 << 20


def check_file(folder: Path, entry: FileEntry, *, full: bool = True) -> None:
    """Raise `PackageError` unless ``folder / entry.path`` has the manifest's size (and sha256)."""
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
            actual = file_entry(path, entry.path).sha256
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


def verify_archive_members(archive: Path, manifest: Manifest) -> None:
    """Check every member as the entrypoint's unpack does, hash the files and compare names,
    sizes and sha256 with ``archive_files``."""
    expected = {entry.path: entry for entry in manifest.archive_files}
    seen: set[str] = set()
    try:
        with open_archive(archive) as tar:
            for member in tar:
                check_member(member, archive)
                if member.isdir():
                    continue
                entry = expected.get(member.name)
                if entry is None or not member.isreg() or member.name in seen:
                    raise PackageError(
                        f"archive member {member.name} is not a regular file listed once in the "
                        "manifest; rebuild the package"
                    )
                seen.add(member.name)
                handle = tar.extractfile(member)
                assert handle is not None  # regular members always have data
                digest = hashlib.sha256()
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
                if member.size != entry.size or digest.hexdigest() != entry.sha256:
                    raise PackageError(
                        f"checksum mismatch for archive member {member.name}; rebuild the package"
                    )
    except tarfile.TarError as exc:
        raise _corrupt(archive, exc) from exc
    except OSError as exc:
        raise _unreadable(archive, exc) from exc
    missing = sorted(set(expected) - seen)
    if missing:
        raise PackageError(f"archive {archive} lacks {', '.join(missing[:5])}")


def _member_bytes(tar: tarfile.TarFile, name: str, what: str) -> bytes:
    """The data of regular member ``name``; ``what`` says which manifest field names it."""
    try:
        handle = tar.extractfile(name)
    except KeyError:
        handle = None
    if handle is None:
        raise PackageError(
            f"{what}: {name} is not a file in the archive; the archive does not match the "
            "manifest: rebuild the package or restore it again"
        )
    return handle.read()


def _unreadable(archive: Path, exc: OSError) -> PackageError:
    # str(exc), not strerror: a failure writing the temporary copy names that file instead.
    return PackageError(
        f"reading archive {archive} failed: {exc}; fix its permissions or storage, or publish "
        "or restore it again"
    )


def _corrupt(archive: Path, exc: tarfile.TarError) -> PackageError:
    return PackageError(
        f"archive {archive} is corrupt ({exc}); publish or restore it again, or rebuild the package"
    )


def _check_plugins(archive: Path, manifest: Manifest, constraints: Path | None) -> None:
    image = image_pins(manifest.triton, constraints)
    names = known_image(image.distributions)
    wheels = []
    try:
        with open_archive(archive) as tar, tempfile.TemporaryDirectory() as tmp:
            for i, plugin in enumerate(manifest.plugins):
                path = Path(tmp) / Path(plugin.wheel).name
                path.write_bytes(_member_bytes(tar, plugin.wheel, f"plugins.{i}"))
                info = read_wheel(path, plugin.wheel)
                if (info.distribution, info.version) != (plugin.distribution, plugin.version):
                    raise PackageError(
                        f"plugin wheel {plugin.wheel} is {info.distribution} {info.version}, the "
                        f"manifest says {plugin.distribution} {plugin.version}"
                    )
                check_against_pins(info, plugin.wheel, image.pins, image.environment, image.ranges)
                check_plugin_files(info, plugin.wheel, names, set(image.pins))
                wheels.append((plugin.wheel, info))
    except tarfile.TarError as exc:  # a same-size damaged archive passes the --quick size check
        raise _corrupt(archive, exc) from exc
    except OSError as exc:
        raise _unreadable(archive, exc) from exc
    check_plugin_entry_points(wheels, image.environment)


def _check_catalogs(archive: Path, manifest: Manifest) -> None:
    try:
        with open_archive(archive) as tar, tempfile.TemporaryDirectory() as tmp:
            for i, catalog in enumerate(manifest.catalogs):
                path = Path(tmp) / f"{i}.jsonl"
                path.write_bytes(_member_bytes(tar, catalog.path, f"catalogs.{i}"))
                check_catalog(path, catalog, f"catalogs.{i}")
    except tarfile.TarError as exc:
        raise _corrupt(archive, exc) from exc
    except OSError as exc:
        raise _unreadable(archive, exc) from exc


def verify_package(folder: Path, *, full: bool = True, constraints: Path | None = None) -> Manifest:
    """Check a version folder: checksums, plugins, catalogs (as the engine reads them), tensors."""
    manifest = load_manifest(folder / MANIFEST_NAME)
    check_file(folder, manifest.archive, full=full)
    for entry in manifest.weight_files:
        check_file(folder, entry, full=full)
    archive = folder / manifest.archive.path  # the file whose checksum was just checked
    if full:
        verify_archive_members(archive, manifest)
    _check_plugins(archive, manifest, constraints)
    _check_catalogs(archive, manifest)
    if manifest.python_model is not None:
        check_python_model(manifest.python_model)
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
        "archive_files": len(manifest.archive_files),
        "archive_bytes": manifest.archive.size,
        "weight_files": len(manifest.weight_files),
        "weight_bytes": sum(e.size for e in manifest.weight_files),
    }
