"""Hand-made archive members for the package tests, and sealing them into a built version so
that only the archive member checks can refuse them."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from runtime.package import MANIFEST_NAME
from runtime.package.build import file_entry
from runtime.package.manifest import check_relative_path

Member = tuple[tarfile.TarInfo, bytes]


def file_member(name: str, data: bytes = b"abc", mode: int = 0o644) -> Member:
    """A regular file member."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def typed_member(name: str, kind: bytes, linkname: str = "", mode: int = 0o755) -> Member:
    """A member of tar type ``kind`` (a folder, link, device, ...) without data."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info, b""


def write_members(path: Path, members: list[Member], fmt: int = tarfile.PAX_FORMAT) -> Path:
    """A new archive at ``path`` holding ``members`` in order."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def add_and_seal(version: Path, extra: list[Member], *, listed: bool = True) -> None:
    """Add ``extra`` to the version's archive, list (when ``listed``) its regular files that a
    manifest can name in ``archive_files`` with their real size and sha256, and re-seal the
    archive's own size and sha256 in the manifest."""
    data = json.loads((version / MANIFEST_NAME).read_text())
    archive = version / data["archive"]["path"]
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar]  # type: ignore[union-attr]
    write_members(archive, members + extra)
    for info, content in extra:
        if listed and info.isreg() and _nameable(info.name):
            data["archive_files"].append(
                {"path": info.name, "size": len(content), "sha256": _sha(content)}
            )
    data["archive"] = file_entry(archive, data["archive"]["path"]).model_dump()
    (version / MANIFEST_NAME).write_text(json.dumps(data))


def _nameable(name: str) -> bool:
    try:
        check_relative_path(name)
    except ValueError:
        return False
    return True


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
