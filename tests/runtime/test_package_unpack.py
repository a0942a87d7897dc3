"""Unpacking writes exactly the manifest's regular files and refuses hostile archives."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from runtime.package import (
    MANIFEST_NAME,
    PackageError,
    UnpackLimits,
    build_package,
    load_manifest,
    unpack_archive,
    verify_package,
)
from runtime.package.build import file_entry
from runtime.package.manifest import FileEntry
from tests.runtime.wheelmaker import make_source

SHA = "0" * 64
MAX_EXTENDED_HEADER_BYTES = UnpackLimits().max_header_bytes


def test_unpack_reproduces_every_file(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    manifest = build_package(source, tmp_path / "out")
    stats = unpack_archive(tmp_path / "out" / "package.tar", manifest.archive_files, tmp_path / "u")
    assert stats.files == len(manifest.archive_files)
    for entry in manifest.archive_files:
        assert (tmp_path / "u" / entry.path).read_bytes() == (source / entry.path).read_bytes()


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _file(name: str, data: bytes = b"abc") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, b""


def _entries(*names: str, size: int = 3) -> list[FileEntry]:
    return [FileEntry(path=n, size=size, sha256=SHA) for n in names]


@pytest.mark.parametrize(
    ("member", "expected"),
    [
        (_special("tokenizer/evil", tarfile.SYMTYPE, "/etc/passwd"), "is a link (-> /etc/passwd)"),
        (_special("tokenizer/hard", tarfile.LNKTYPE, "a.txt"), "is a link (-> a.txt)"),
        (_special("dev", tarfile.CHRTYPE), "is a device, fifo or other special file"),
        (_special("fifo", tarfile.FIFOTYPE), "is a device, fifo or other special file"),
        (_file("/etc/cron.d/x"), "is absolute"),
        (_file("../outside.txt"), "stay inside the package root"),
        (_file("a/../../outside.txt"), "stay inside the package root"),
        (_file("extra.txt"), "extra.txt (3 bytes) is not in the manifest"),
        (_file("a.txt"), "has a.txt twice"),
    ],
)
def test_hostile_member_is_refused(
    tmp_path: Path, member: tuple[tarfile.TarInfo, bytes], expected: str
) -> None:
    archive = _tar(tmp_path / "p.tar", [_file("a.txt"), member])
    dest = tmp_path / "dest"
    with pytest.raises(PackageError) as err:
        unpack_archive(archive, _entries("a.txt"), dest)
    assert expected in str(err.value)
    assert not (tmp_path / "outside.txt").exists()
    assert not any(p.is_symlink() for p in dest.rglob("*"))


def test_member_with_another_size_is_refused(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "p.tar", [_file("a.txt", b"abcd")])
    with pytest.raises(PackageError, match=r"a\.txt \(4 bytes\) is not in the manifest with that"):
        unpack_archive(archive, _entries("a.txt"), tmp_path / "dest")


def test_missing_member_is_named(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "p.tar", [_file("a.txt")])
    with pytest.raises(PackageError, match=r"lacks b\.txt"):
        unpack_archive(archive, _entries("a.txt", "b.txt"), tmp_path / "dest")


def test_limits_hold_against_the_manifest(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "p.tar", [_file("a.txt"), _file("b.txt")])
    with pytest.raises(PackageError, match="over the unpack limits"):
        unpack_archive(
            archive, _entries("a.txt", "b.txt"), tmp_path / "d1", UnpackLimits(max_total_bytes=5)
        )
    with pytest.raises(PackageError, match="over the unpack limits"):
        unpack_archive(
            archive, _entries("a.txt", "b.txt"), tmp_path / "d2", UnpackLimits(max_members=1)
        )


def test_target_must_be_empty(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "p.tar", [_file("a.txt")])
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "a.txt").symlink_to(tmp_path / "victim")
    with pytest.raises(PackageError, match="is not empty"):
        unpack_archive(archive, _entries("a.txt"), tmp_path / "dest")
    assert not (tmp_path / "victim").exists()


def test_garbage_is_reported_as_corrupt(tmp_path: Path) -> None:
    archive = tmp_path / "p.tar"
    archive.write_bytes(b"\x01" * 2048)
    with pytest.raises(PackageError, match="is corrupt"):
        unpack_archive(archive, _entries("a.txt"), tmp_path / "dest")


def _with_headers(path: Path, info: tarfile.TarInfo, data: bytes, fmt: int) -> Path:
    with tarfile.open(path, "w", format=fmt) as tar:
        tar.addfile(info, io.BytesIO(data))
    return path


def _over_bound(kind: str) -> tuple[tarfile.TarInfo, int]:
    """A one-byte member whose pax (or GNU long-name) header alone is just over the bound."""
    if kind == "pax":
        info = tarfile.TarInfo("a.txt")
        info.pax_headers = {"comment": "x" * MAX_EXTENDED_HEADER_BYTES}
        return info, tarfile.PAX_FORMAT
    folders = ("d" * 255 + "/") * (MAX_EXTENDED_HEADER_BYTES // 256)
    return tarfile.TarInfo(folders + "a.txt"), tarfile.GNU_FORMAT


@pytest.mark.parametrize("kind", ["pax", "gnu_longname"])
def test_extended_header_over_the_bound_is_refused(tmp_path: Path, kind: str) -> None:
    info, fmt = _over_bound(kind)
    info.size = 1
    archive = _with_headers(tmp_path / "p.tar", info, b"z", fmt)
    with pytest.raises(PackageError, match="bytes of pax or GNU long-name headers, over the"):
        unpack_archive(archive, _entries(info.name, size=1), tmp_path / "dest")
    assert not (tmp_path / "dest" / "a.txt").exists()


def test_chain_of_small_extended_headers_is_refused_within_the_bound(tmp_path: Path) -> None:
    # tarfile reads chained headers recursively: 400 of them would raise RecursionError.
    record = b"11 comment=\n"
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, len(record)
    block = header.tobuf(format=tarfile.USTAR_FORMAT) + record.ljust(tarfile.BLOCKSIZE, b"\0")
    plain = _tar(tmp_path / "plain.tar", [_file("a.txt")]).read_bytes()
    archive = tmp_path / "p.tar"
    archive.write_bytes(block * 400 + plain)
    with pytest.raises(PackageError, match="bytes of pax or GNU long-name headers, over the"):
        unpack_archive(archive, _entries("a.txt"), tmp_path / "dest")


def _sparse(form: str) -> bytes:
    """One sparse member in the given form: GNU's own header type, or pax GNU sparse 0.1 or
    1.0 (whose map, declared here as 10**8 regions long, leads the member's data)."""
    if form == "gnu":
        info = tarfile.TarInfo("a.txt")
        info.type = tarfile.GNUTYPE_SPARSE
        return info.tobuf(format=tarfile.GNU_FORMAT) + bytes(2 * tarfile.BLOCKSIZE)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if form == "pax-0.1":
            info = tarfile.TarInfo("a.txt")
            info.pax_headers = {"GNU.sparse.map": "0,3", "GNU.sparse.size": "3"}
            data = b"abc"
        else:
            info = tarfile.TarInfo("GNUSparseFile.0/a.txt")
            info.pax_headers = {
                "GNU.sparse.major": "1",
                "GNU.sparse.minor": "0",
                "GNU.sparse.name": "a.txt",
                "GNU.sparse.realsize": "3",
            }
            data = b"100000000\n" + b"0\n3\n" * 1000
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("form", ["gnu", "pax-0.1", "pax-1.0"])
def test_sparse_member_is_refused(tmp_path: Path, form: str) -> None:
    archive = tmp_path / "p.tar"
    archive.write_bytes(_sparse(form))
    with pytest.raises(PackageError, match="is a sparse file"):
        unpack_archive(archive, _entries("a.txt"), tmp_path / "dest")
    assert not (tmp_path / "dest" / "a.txt").exists()


def test_long_names_within_the_bound_unpack(tmp_path: Path) -> None:
    name = "tokenizer/" + "é" * 100 + ".json"  # a pax path record, as package build writes it
    info = tarfile.TarInfo(name)
    info.size = 3
    info.pax_headers = {"comment": "x" * (MAX_EXTENDED_HEADER_BYTES // 2)}
    archive = _with_headers(tmp_path / "p.tar", info, b"abc", tarfile.PAX_FORMAT)
    unpack_archive(archive, _entries(name), tmp_path / "dest")
    assert (tmp_path / "dest" / name).read_bytes() == b"abc"


def test_verify_refuses_the_extended_header_the_unpack_refuses(tmp_path: Path) -> None:
    build_package(make_source(tmp_path / "src"), tmp_path / "out")
    version = tmp_path / "out"
    archive = version / "package.tar"
    members = []
    with tarfile.open(archive) as tar:
        for member in tar:
            members.append((member, tar.extractfile(member).read()))  # type: ignore[union-attr]
    members[0][0].pax_headers = {"comment": "x" * MAX_EXTENDED_HEADER_BYTES}
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for member, data in members:
            tar.addfile(member, io.BytesIO(data))
    manifest = load_manifest(version / MANIFEST_NAME)
    sealed = manifest.model_copy(update={"archive": file_entry(archive, "package.tar")})
    (version / MANIFEST_NAME).write_text(sealed.to_json())
    with pytest.raises(PackageError, match="bytes of pax or GNU long-name headers, over the"):
        verify_package(version)
