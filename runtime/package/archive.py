"""Whether a package archive is acceptable: the one set of member checks that ``package build``
(on the archive it wrote), ``package verify`` (with or without ``--quick``) and the entrypoint's
unpack all run, so what verify passes the pod can unpack."""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from runtime.package.errors import PackageError
from runtime.package.manifest import FileEntry, check_relative_path

__all__ = ["ArchiveFile", "UnpackLimits", "check_archive", "read_member", "shown_path"]


@dataclass(frozen=True)
class UnpackLimits:
    """What an archive may hold, whatever its manifest says; `check_archive` enforces each."""

    max_total_bytes: int = 64 << 30
    """Bytes of all files together (the entrypoint's default LLM_SERVING_MAX_UNPACK_BYTES)."""
    max_members: int = 100_000
    """Members of every kind, folder entries included."""
    max_path_bytes: int = 1024
    """UTF-8 bytes of a member's path, far below PATH_MAX with the unpack folder in front."""
    max_name_bytes: int = 255
    """UTF-8 bytes of one path component (NAME_MAX of ext4, XFS and Lustre)."""
    max_depth: int = 32
    """Components of a member's path (``a/b/c.json`` has 3)."""
    max_header_bytes: int = 64 << 10
    """Bytes of pax and GNU long-name headers (blocks included) before one member: far above
    the path records ``package build`` writes, and low enough that a chain of them, which
    tarfile reads recursively, stays clear of the recursion limit."""


@dataclass(frozen=True)
class ArchiveFile:
    """A regular file member that passed every check, and where its bytes lie in the archive."""

    path: str
    offset: int
    size: int


_EXTENDED_TYPES = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)
_SPECIAL_TYPES = (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE)
_SHOWN_CHARS = 120


def shown_path(name: str) -> str:
    """``name`` as a message shows it: bare when printable, else quoted (one line whatever it
    holds), and past 120 characters cut in the middle (the rule says how long it is)."""
    if len(name) > _SHOWN_CHARS:
        head, tail = name[: _SHOWN_CHARS // 2], name[-_SHOWN_CHARS // 2 :]
        return f"{shown_path(head)}...{shown_path(tail)}"
    return name if name.isprintable() else repr(name)


class _CheckedTarFile(tarfile.TarFile):
    """A tar reader that knows the limits, the archive's size and the last member read, so
    that its header hooks can refuse early and say where."""

    def __init__(self, handle: BinaryIO, where: str, size: int, limits: UnpackLimits) -> None:
        self.where, self.archive_size, self.limits = where, size, limits
        self.previous: str | None = None
        super().__init__(fileobj=handle, mode="r", tarinfo=_BoundedTarInfo)

    def at(self, offset: int) -> str:
        after = "" if self.previous is None else f" (after member {shown_path(self.previous)})"
        return f"the member at byte {offset}{after}"


class _BoundedTarInfo(tarfile.TarInfo):
    """A member header that refuses, before tarfile reads them, extended headers over the
    limit or past the end of the archive, and every form of sparse file."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        assert isinstance(tar, _CheckedTarFile)
        # tarfile reads each extended header whole and then the next header recursively, and
        # moves ``tar.offset`` only past a member, so it is where this member's headers begin.
        if self.type == tarfile.GNUTYPE_SPARSE:
            # Its extension blocks would all be read before the member checks could refuse it.
            raise _sparse(self.name)
        if self.type in _EXTENDED_TYPES:
            used = self.offset + tarfile.BLOCKSIZE + self.size - tar.offset
            if self.size < 0 or used > tar.limits.max_header_bytes:
                raise PackageError(
                    f"archive {tar.where}: {tar.at(tar.offset)} has {used} bytes of pax or GNU "
                    f"long-name headers, over the {tar.limits.max_header_bytes} that unpack reads "
                    "(UnpackLimits.max_header_bytes); package build never writes such headers: "
                    "rebuild the package"
                )
            if self.offset + tarfile.BLOCKSIZE + self.size > tar.archive_size:
                raise PackageError(
                    f"archive {tar.where} ends inside the headers of {tar.at(tar.offset)}; "
                    "the copy is incomplete: publish or restore it again"
                )
        return super()._proc_member(tar)  # type: ignore[misc]  # typeshed omits this hook

    # A pax header announcing GNU sparse 0.0, 0.1 or 1.0: tarfile would parse its map (however
    # long, with int() that raises ValueError) before the member checks could refuse it.
    def _proc_gnusparse_00(
        self, next: tarfile.TarInfo, pax_headers: dict[str, str], buf: bytes
    ) -> None:
        raise _sparse(pax_headers.get("GNU.sparse.name", next.name))

    def _proc_gnusparse_01(self, next: tarfile.TarInfo, pax_headers: dict[str, str]) -> None:
        raise _sparse(pax_headers.get("GNU.sparse.name", next.name))

    def _proc_gnusparse_10(
        self, next: tarfile.TarInfo, pax_headers: dict[str, str], tar: tarfile.TarFile
    ) -> None:
        raise _sparse(pax_headers.get("GNU.sparse.name", next.name))

    def _apply_pax_info(self, pax_headers: dict[str, str], encoding: str, errors: str) -> None:
        # GNU.sparse.size and .realsize alone (or in a global header) reach int() here.
        if any(key.startswith("GNU.sparse.") for key in pax_headers):
            raise _sparse(pax_headers.get("GNU.sparse.name", self.name))
        super()._apply_pax_info(pax_headers, encoding, errors)  # type: ignore[misc]


def _sparse(name: str) -> PackageError:
    return PackageError(
        f"archive member {shown_path(name)} is a sparse file; packages hold regular files only: "
        "rebuild the package"
    )


def check_archive(
    handle: BinaryIO,
    where: str,
    expected: Sequence[FileEntry],
    limits: UnpackLimits | None = None,
) -> list[ArchiveFile]:
    """The regular files of the archive open in ``handle`` (``where`` names it in messages),
    in archive order, once every member is checked; else raises `PackageError` naming the
    member by its path in the archive and the rule it breaks.

    Members are regular files or folders (no links, devices, fifos, sparse or unknown types),
    without setuid or setgid bits, at normalised relative paths within ``limits`` (bytes,
    component bytes, depth), each once, no path both a file and a folder or under a file; every
    file is in ``expected`` with its size and every entry of ``expected`` is in the archive,
    whose bytes all lie within the file, and which ends with tar's end-of-archive block.
    Content checksums are the caller's job: only headers are read here.
    """
    limits = UnpackLimits() if limits is None else limits
    sizes = {entry.path: entry.size for entry in expected}
    if len(sizes) > limits.max_members or sum(sizes.values()) > limits.max_total_bytes:
        raise PackageError(
            f"manifest lists {len(sizes)} files / {sum(sizes.values())} bytes, over the unpack "
            f"limits ({limits.max_members} files / {limits.max_total_bytes} bytes)"
        )
    try:
        archive_size = os.fstat(handle.fileno()).st_size
        return _check_members(handle, where, archive_size, sizes, limits)
    except OSError as exc:
        raise PackageError(
            f"reading archive {where} failed: {exc.strerror or exc}; fix its permissions or "
            "storage, or publish or restore it again"
        ) from exc


def _check_members(
    handle: BinaryIO, where: str, archive_size: int, sizes: dict[str, int], limits: UnpackLimits
) -> list[ArchiveFile]:
    files: list[ArchiveFile] = []
    tree = _Tree(where)
    tar: _CheckedTarFile | None = None
    try:
        tar = _CheckedTarFile(handle, where, archive_size, limits)
        while (member := tar.next()) is not None:
            name = member.name.rstrip("/") if member.isdir() else member.name
            if tree.count >= limits.max_members:
                raise PackageError(
                    f"archive {where} has more than {limits.max_members} members, folder "
                    f"entries included (UnpackLimits.max_members): member {shown_path(name)} is "
                    "one too many; package fewer files"
                )
            _check_kind(member, name)
            _check_name(name, where, limits)
            tree.add(name, member.isdir())
            if not member.isdir():
                files.append(_check_file(member, name, where, archive_size, sizes))
            tar.previous = name
        _check_end(handle, where, tar)
    except tarfile.TarError as exc:
        raise _corrupt(where, tar, exc) from exc
    except PackageError:
        raise
    except (ValueError, OverflowError, EOFError) as exc:
        # Defensive: tarfile's parsers call int() and seek() on header values, and anything
        # they let through must still end as a PackageError. The hooks above close the paths
        # known to raise these (sparse maps); the fuzz tests have not reached this since.
        raise _corrupt(where, tar, exc) from exc
    finally:
        if tar is not None:
            tar.close()
    missing = sorted(set(sizes) - {f.path for f in files})
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise PackageError(
            f"archive {where} lacks {', '.join(shown_path(m) for m in missing[:5])}{more}; "
            "rebuild the package"
        )
    return files


def _check_kind(member: tarfile.TarInfo, name: str) -> None:
    kind = None
    if member.issym() or member.islnk():
        kind = f"a link (-> {shown_path(member.linkname)})"
    elif member.issparse():
        kind = "a sparse file"
    elif member.type in _SPECIAL_TYPES:
        kind = "a device, fifo or other special file"
    elif not (member.isreg() or member.isdir()):
        kind = f"a device, fifo or other special file (tar type {member.type!r})"
    if kind is not None:
        raise PackageError(
            f"archive member {shown_path(name)} is {kind}; packages hold regular files only"
        )
    if member.mode < 0:
        raise PackageError(
            f"archive member {shown_path(name)} has an invalid mode ({member.mode}); rebuild "
            "the package"
        )
    if member.mode & (stat.S_ISUID | stat.S_ISGID):
        raise PackageError(
            f"archive member {shown_path(name)} has mode {member.mode:#o}, with the setuid or "
            "setgid bit; packages hold plain files (unpack writes them 0644): rebuild the package"
        )


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _check_name(name: str, where: str, limits: UnpackLimits) -> None:
    size = _utf8_len(name)
    if size > limits.max_path_bytes:
        raise PackageError(
            f"archive member {shown_path(name)} has a {size}-byte path, over the "
            f"{limits.max_path_bytes} a package may use (UnpackLimits.max_path_bytes); "
            "shorten it and rebuild the package"
        )
    parts = name.split("/")
    if len(parts) > limits.max_depth:
        raise PackageError(
            f"archive member {shown_path(name)} is {len(parts)} levels deep, over the "
            f"{limits.max_depth} a package may use (UnpackLimits.max_depth); move it up "
            "and rebuild the package"
        )
    longest = max(parts, key=_utf8_len)
    if _utf8_len(longest) > limits.max_name_bytes:
        raise PackageError(
            f"archive member {shown_path(name)} has a name of {_utf8_len(longest)} bytes, over "
            f"the {limits.max_name_bytes} a file system takes (UnpackLimits.max_name_bytes); "
            "shorten it and rebuild the package"
        )
    try:
        check_relative_path(name)
    except ValueError as exc:
        raise PackageError(f"archive {where}: member {exc}") from exc


class _Tree:
    """The paths read so far: each once, none both a file and a folder (stated or implied by
    a path under it)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.count = 0
        self.files: set[str] = set()
        self.folders: set[str] = set()
        """Folder entries and every folder above a member."""

    def add(self, name: str, is_dir: bool) -> None:
        if name in self.files or (is_dir and name in self.folders):
            raise PackageError(f"archive {self.where} has {shown_path(name)} twice")
        if not is_dir and name in self.folders:
            raise PackageError(
                f"archive member {shown_path(name)} is a file, but the archive holds members under "
                "it; rename one of them and rebuild the package"
            )
        parents = []
        head = name
        while "/" in head:
            head = head.rpartition("/")[0]
            if head in self.files:
                raise PackageError(
                    f"archive member {shown_path(name)} lies under {shown_path(head)}, a file in "
                    "the archive; rename one of them and rebuild the package"
                )
            parents.append(head)
        self.count += 1
        (self.folders if is_dir else self.files).add(name)
        self.folders.update(parents)


def _check_file(
    member: tarfile.TarInfo, name: str, where: str, archive_size: int, sizes: dict[str, int]
) -> ArchiveFile:
    if member.size < 0:
        raise PackageError(
            f"archive {where} is corrupt: member {shown_path(name)} has size {member.size}; "
            "publish or restore it again, or rebuild the package"
        )
    # Checked before tarfile seeks past it: its data and their padding to a whole block.
    end = member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    if end > archive_size:
        raise PackageError(
            f"archive {where} ends inside member {shown_path(name)} (its blocks run to byte {end}, "
            f"the archive has {archive_size}); the copy is incomplete: publish or restore it "
            "again"
        )
    if sizes.get(name) != member.size:
        raise PackageError(
            f"archive member {shown_path(name)} ({member.size} bytes) is not in the manifest with "
            "that size; rebuild the package"
        )
    return ArchiveFile(name, member.offset_data, member.size)


def _check_end(handle: BinaryIO, where: str, tar: _CheckedTarFile) -> None:
    # tarfile stops quietly at a header it cannot read, or at the end of the file, past the
    # first member: only tar's end-of-archive block (512 zero bytes) says nothing was cut off.
    handle.seek(tar.offset)
    block = handle.read(tarfile.BLOCKSIZE)
    if block != bytes(tarfile.BLOCKSIZE):
        said = "ends" if len(block) < tarfile.BLOCKSIZE else "has an unreadable header"
        last = (
            "at its start" if tar.previous is None else f"after member {shown_path(tar.previous)}"
        )
        raise PackageError(
            f"archive {where} {said} {last} (byte {tar.offset}), where tar's end-of-archive "
            "block should be; the copy is incomplete or corrupt: publish or restore it again, "
            "or rebuild the package"
        )


def _corrupt(where: str, tar: _CheckedTarFile | None, exc: Exception) -> PackageError:
    last = (
        "" if tar is None or tar.previous is None else f" after member {shown_path(tar.previous)}"
    )
    return PackageError(
        f"archive {where} is corrupt{last} ({exc}); publish or restore it again, or rebuild "
        "the package"
    )


def read_member(handle: BinaryIO, where: str, member: ArchiveFile) -> bytes:
    """The bytes of a member `check_archive` returned, read at its offset."""
    try:
        data = os.pread(handle.fileno(), member.size, member.offset)
    except OSError as exc:
        raise PackageError(
            f"reading member {shown_path(member.path)} of archive {where} failed: "
            f"{exc.strerror or exc}; fix its permissions or storage, or publish or restore it "
            "again"
        ) from exc
    if len(data) != member.size:
        raise PackageError(
            f"archive {where} ends inside member {shown_path(member.path)} (it changed while being "
            "read); publish or restore it again"
        )
    return data
