"""Unpack a package archive to local disk: every member checked first (`check_archive`, as
``package verify`` checks it), then the data copied in the kernel (``copy_file_range``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.package.archive import ArchiveFile, UnpackLimits, check_archive, shown_path
from runtime.package.errors import PackageError
from runtime.package.manifest import FileEntry

__all__ = ["UnpackStats", "unpack_archive"]


@dataclass(frozen=True)
class UnpackStats:
    """What an unpack wrote."""

    files: int
    bytes: int


def unpack_archive(
    archive: Path,
    expected: Sequence[FileEntry],
    dest: Path,
    limits: UnpackLimits | None = None,
) -> UnpackStats:
    """Extract ``archive`` into the new or empty folder ``dest``.

    Writes nothing unless `check_archive` accepts every member against ``expected`` and
    ``limits``; every failure, the archive's or the disk's, is a `PackageError` naming the
    member. Content checksums are the caller's job (the archive's sha256 covers every member).
    """
    try:
        handle = archive.open("rb")
    except OSError as exc:
        raise PackageError(f"cannot read archive {archive}: {exc.strerror or exc}") from exc
    with handle:
        files = check_archive(handle, str(archive), expected, limits)
        try:
            dest.mkdir(parents=True, exist_ok=True)
            occupied = any(dest.iterdir())
        except OSError as exc:
            raise PackageError(f"cannot use unpack target {dest}: {exc.strerror or exc}") from exc
        if occupied:
            raise PackageError(f"unpack target {dest} is not empty")
        made_dirs: set[str] = {""}
        for member in files:
            parent = member.path.rpartition("/")[0]
            try:
                if parent not in made_dirs:
                    _make_folders(dest, parent, made_dirs)
                _copy_range(handle.fileno(), member, dest / member.path, archive)
            except OSError as exc:
                raise PackageError(
                    f"writing archive member {shown_path(member.path)} to {dest} failed: "
                    f"{exc.strerror or exc}; free space or fix the unpack folder"
                ) from exc
    return UnpackStats(files=len(files), bytes=sum(f.size for f in files))


def _make_folders(dest: Path, folder: str, made: set[str]) -> None:
    """Create ``dest / folder`` one level at a time: os.makedirs recurses once per missing
    level, which a deep path (under limits a caller raised) turns into a RecursionError."""
    # Only this function creates entries under dest and it never creates links, so no folder
    # on this path can be a symlink planted by the archive.
    head = ""
    for part in folder.split("/"):
        head = f"{head}/{part}" if head else part
        if head not in made:
            with contextlib.suppress(FileExistsError):
                os.mkdir(dest / head)
            made.add(head)


def _copy_range(src_fd: int, member: ArchiveFile, target: Path, archive: Path) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    dst_fd = os.open(target, flags, 0o644)
    try:
        done, size, offset = 0, member.size, member.offset
        use_copy_range = hasattr(os, "copy_file_range")
        while done < size:
            if use_copy_range:
                try:
                    n = os.copy_file_range(src_fd, dst_fd, size - done, offset + done)
                except OSError:
                    use_copy_range = False  # e.g. EXDEV on older kernels: sendfile still works
                    continue
            else:
                n = os.sendfile(dst_fd, src_fd, offset + done, size - done)
            if n == 0:  # check_archive saw the whole member: the file shrank since
                raise PackageError(
                    f"archive {archive} ends inside member {shown_path(member.path)} (it changed "
                    "while being unpacked); publish or restore it again"
                )
            done += n
    finally:
        os.close(dst_fd)
