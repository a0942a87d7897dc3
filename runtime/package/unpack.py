"""Unpack a package archive to local disk: regular files only, every name and size checked
against the manifest, data copied in the kernel (``copy_file_range``) rather than through Python."""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from runtime.package.errors import PackageError
from runtime.package.manifest import FileEntry, check_relative_path

__all__ = [
    "MAX_EXTENDED_HEADER_BYTES",
    "UnpackLimits",
    "UnpackStats",
    "check_member",
    "open_archive",
    "unpack_archive",
]

MAX_EXTENDED_HEADER_BYTES = 64 << 10
"""Most bytes of pax and GNU long-name headers (blocks included) before one member: far above
the path records ``package build`` writes, and low enough that a chain of them, which tarfile
reads recursively, stays clear of the recursion limit."""
_EXTENDED_TYPES = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)


@dataclass(frozen=True)
class UnpackLimits:
    """Ceilings that hold even when the manifest itself is hostile."""

    max_total_bytes: int = 512 << 30
    max_members: int = 100_000


@dataclass(frozen=True)
class UnpackStats:
    """What an unpack wrote."""

    files: int
    bytes: int


class _BoundedTarInfo(tarfile.TarInfo):
    """A member header that refuses oversized extended headers before tarfile reads them."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        # tarfile reads each extended header whole and then the next header recursively, and
        # moves ``tar.offset`` only past a member, so it is where this member's headers begin.
        if self.type == tarfile.GNUTYPE_SPARSE:
            # Its extension blocks would all be read before check_member could refuse it.
            raise _sparse_refused(tar, tar.offset)
        if self.type in _EXTENDED_TYPES:
            where = _archive_name(tar)
            used = self.offset + tarfile.BLOCKSIZE + self.size - tar.offset
            if self.size < 0 or used > MAX_EXTENDED_HEADER_BYTES:
                raise PackageError(
                    f"archive {where}: the member at byte {tar.offset} has {used} bytes of "
                    f"pax or GNU long-name headers, over the {MAX_EXTENDED_HEADER_BYTES} that "
                    "unpack reads; package build never writes such headers: rebuild the package"
                )
        return super()._proc_member(tar)  # type: ignore[misc]  # typeshed omits this hook

    def _proc_gnusparse_10(
        self, next: tarfile.TarInfo, pax_headers: dict[str, str], tar: tarfile.TarFile
    ) -> None:
        # A pax header announcing GNU sparse 1.0: its map leads the member's data and tarfile
        # would read all of it, however long, into a list before check_member could refuse it.
        raise _sparse_refused(tar, self.offset)


def _archive_name(tar: tarfile.TarFile) -> str:
    return os.fsdecode(tar.name) if tar.name is not None else "the archive"


def _sparse_refused(tar: tarfile.TarFile, offset: int) -> PackageError:
    return PackageError(
        f"archive {_archive_name(tar)}: the member at byte {offset} is a sparse file; "
        "packages hold regular files only: rebuild the package"
    )


def open_archive(archive: Path) -> tarfile.TarFile:
    """``archive`` opened for reading with extended headers bounded; raises `PackageError` if it
    cannot be opened or its first member's headers are refused (`tarfile.TarError` if corrupt)."""
    try:
        return tarfile.open(archive, "r:", tarinfo=_BoundedTarInfo)
    except OSError as exc:
        raise PackageError(f"cannot read archive {archive}: {exc.strerror or exc}") from exc


def unpack_archive(
    archive: Path,
    expected: list[FileEntry],
    dest: Path,
    limits: UnpackLimits | None = None,
) -> UnpackStats:
    """Extract ``archive`` into the new or empty folder ``dest``.

    Refuses links, devices, absolute or parent-relative names, members the manifest does not
    list (or lists with another size), duplicates, missing members and anything past ``limits``.
    Content checksums are the caller's job (the archive's sha256 covers every member).
    """
    limits = UnpackLimits() if limits is None else limits
    sizes = {entry.path: entry.size for entry in expected}
    if len(sizes) > limits.max_members or sum(sizes.values()) > limits.max_total_bytes:
        raise PackageError(
            f"manifest lists {len(sizes)} files / {sum(sizes.values())} bytes, over the unpack "
            f"limits ({limits.max_members} files / {limits.max_total_bytes} bytes)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise PackageError(f"unpack target {dest} is not empty")
    written: set[str] = set()
    total = 0
    made_dirs: set[str] = {""}
    try:
        src_fd = os.open(archive, os.O_RDONLY)
    except OSError as exc:
        raise PackageError(f"cannot read archive {archive}: {exc.strerror}") from exc
    try:
        with open_archive(archive) as tar:
            for member in tar:
                name = check_member(member, archive)
                if member.isdir():
                    continue
                if name in written:
                    raise PackageError(f"archive {archive} has {name} twice")
                if sizes.get(name) != member.size:
                    raise PackageError(
                        f"archive member {name} ({member.size} bytes) is not in the manifest "
                        "with that size; rebuild the package"
                    )
                total += member.size
                if total > limits.max_total_bytes:
                    raise PackageError(f"archive {archive} exceeds {limits.max_total_bytes} bytes")
                parent = name.rpartition("/")[0]
                if parent not in made_dirs:
                    # Only this function creates entries under dest and it never creates links,
                    # so no parent on this path can be a symlink planted by the archive.
                    os.makedirs(dest / parent, exist_ok=True)
                    made_dirs.add(parent)
                _copy_range(src_fd, member.offset_data, member.size, dest / name)
                written.add(name)
    except tarfile.TarError as exc:
        raise PackageError(f"archive {archive} is corrupt: {exc}") from exc
    finally:
        os.close(src_fd)
    missing = sorted(set(sizes) - written)
    if missing:
        raise PackageError(f"archive {archive} lacks {', '.join(missing[:5])}")
    return UnpackStats(files=len(written), bytes=total)


def check_member(member: tarfile.TarInfo, archive: Path) -> str:
    """The member's name (a folder's without its trailing ``/``) if it is a regular file or
    folder at a normalised relative path; else raises `PackageError`."""
    name = member.name.rstrip("/") if member.isdir() else member.name
    kind = None
    if member.issym() or member.islnk():
        kind = f"a link (-> {member.linkname})"
    elif member.issparse():
        kind = "a sparse file"
    elif not (member.isreg() or member.isdir()):
        kind = "a device, fifo or other special file"
    if kind is not None:
        raise PackageError(f"archive member {name} is {kind}; packages hold regular files only")
    try:
        check_relative_path(name)
    except ValueError as exc:
        raise PackageError(f"archive {archive}: member {exc}") from exc
    return name


def _copy_range(src_fd: int, offset: int, size: int, target: Path) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    dst_fd = os.open(target, flags, 0o644)
    try:
        done = 0
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
            if n == 0:
                raise PackageError(f"archive ends inside member {target.name}")
            done += n
    finally:
        os.close(dst_fd)
