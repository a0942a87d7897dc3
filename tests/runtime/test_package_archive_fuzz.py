"""A bounded fuzz of the archive reader: Hypothesis rewrites header fields (checksum fixed or
not), pax records and whole header blocks of small archives in the three formats tarfile
reads, and cuts them anywhere. `check_archive` (what verify runs) and `unpack_archive` (stage 2)
must each end in a result or one `PackageError` line, and the same one. A few seconds: CI=true
replays a derandomized set (tests/conftest.py)."""

from __future__ import annotations

import io
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from runtime.package import PackageError, UnpackLimits, check_archive, unpack_archive
from runtime.package.manifest import FileEntry

BLOCK = tarfile.BLOCKSIZE
# The ustar header's fields: (offset, length).
FIELDS = {
    "name": (0, 100),
    "mode": (100, 8),
    "uid": (108, 8),
    "gid": (116, 8),
    "size": (124, 12),
    "mtime": (136, 12),
    "chksum": (148, 8),
    "type": (156, 1),
    "linkname": (157, 100),
    "magic": (257, 8),
    "uname": (265, 32),
    "devmajor": (329, 8),
    "prefix": (345, 155),
    "sparse": (386, 96),  # GNU's sparse map and its extension flag, where old GNU puts them
}
# Small limits: the seeds come close to each, so a few mutated bytes cross them.
LIMITS = UnpackLimits(
    max_members=6, max_path_bytes=200, max_name_bytes=160, max_depth=4, max_header_bytes=4096
)


@dataclass(frozen=True)
class Seed:
    data: bytes
    headers: tuple[int, ...]
    """Offsets of every header block, extended headers and pax records included."""
    expected: tuple[FileEntry, ...]


def _seed(fmt: int, members: list[tuple[str, bytes | None]]) -> Seed:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(data)
            if fmt == tarfile.PAX_FORMAT:
                info.pax_headers = {"comment": "fuzz"}
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = buffer.getvalue()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        found = tar.getmembers()
    headers = tuple(b for m in found for b in range(m.offset, m.offset_data, BLOCK))
    expected = tuple(
        FileEntry(path=name, size=len(data), sha256="0" * 64)
        for name, data in members
        if data is not None
    )
    return Seed(raw, headers, expected)


SEEDS = [
    _seed(tarfile.USTAR_FORMAT, [("a.txt", b"abc"), ("d", None), ("d/b.bin", bytes(700))]),
    _seed(tarfile.GNU_FORMAT, [("long/" + "x" * 120, b"z" * 513), ("c.txt", b"")]),
    _seed(tarfile.PAX_FORMAT, [("é/" + "y" * 110 + ".json", b"{}"), ("e", None), ("e/f", b"1")]),
]
HOSTILE_RECORDS = [
    b"size=-5000",
    b"size=99999999999999999999",
    b"size=1",
    b"path=../escape",
    b"path=/abs",
    b"path=" + b"a/" * 120 + b"f",
    b"path=a\nb",
    b"path=\xff\xfe",
    b"linkpath=/etc/passwd",
    b"mtime=nan",
    b"uid=-1",
    b"hdrcharset=BINARY",
    b"GNU.sparse.map=1,x",
    b"GNU.sparse.size=zz",
    b"GNU.sparse.realsize=q",
    b"GNU.sparse.major=1",
    b"GNU.sparse.name=a.txt",
]


def _record(body: bytes) -> bytes:
    """A pax record ``"<length> <body>\\n"`` whose length counts itself."""
    length = len(body) + 3
    while len(f"{length} ".encode()) + len(body) + 1 != length:
        length += 1
    return f"{length} ".encode() + body + b"\n"


def _fix_checksum(data: bytearray, at: int) -> None:
    block = data[at : at + BLOCK]
    if len(block) < BLOCK:
        return
    block[148:156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\x00 " % sum(block)


def _numbers(length: int) -> st.SearchStrategy[bytes]:
    """Octal text, base-256 (GNU) and raw bytes, as a numeric field of ``length`` holds them."""
    return st.one_of(
        st.integers(min_value=0, max_value=8 ** (length - 1) - 1).map(
            lambda n: b"%0*o\x00" % (length - 1, n)
        ),
        st.integers(min_value=-(2 ** (8 * length - 9)), max_value=2 ** (8 * length - 9)).map(
            lambda n: (
                (b"\x80" if n >= 0 else b"\xff")
                + (n % 2 ** (8 * length - 8)).to_bytes(length - 1, "big")
            )
        ),
        st.binary(min_size=length, max_size=length),
    )


@st.composite
def fuzzed_archives(draw: st.DrawFn) -> tuple[bytes, tuple[FileEntry, ...]]:
    seed = draw(st.sampled_from(SEEDS))
    data = bytearray(seed.data)
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        at = draw(st.sampled_from(seed.headers))
        name = draw(st.sampled_from(sorted(FIELDS)))
        start, length = FIELDS[name]
        if name == "type":
            value = draw(st.sampled_from([b"0", b"1", b"2", b"3", b"5", b"7", b"x", b"g", b"L"]))
            value = draw(st.one_of(st.just(value), st.binary(min_size=1, max_size=1)))
        elif name in ("name", "linkname", "prefix", "magic", "uname"):
            value = draw(st.binary(max_size=length)).ljust(length, b"\0")
        else:
            value = draw(_numbers(length))
        data[at + start : at + start + length] = value
        if draw(st.integers(min_value=0, max_value=4)):  # mostly valid: get past the checksum
            _fix_checksum(data, at)
    if draw(st.booleans()):
        # A pax header of hostile records before one of the members.
        records = b"".join(_record(r) for r in draw(st.lists(st.sampled_from(HOSTILE_RECORDS))))
        info = tarfile.TarInfo("././@PaxHeader")
        info.type, info.size = (
            draw(st.sampled_from([tarfile.XHDTYPE, tarfile.XGLTYPE])),
            len(records),
        )
        block = info.tobuf(format=tarfile.USTAR_FORMAT) + records
        block += bytes(-len(block) % BLOCK)
        at = draw(st.sampled_from(seed.headers))
        data[at:at] = block
    if draw(st.booleans()):
        # A whole header block of random bytes, its checksum usually made valid.
        at = draw(st.sampled_from(seed.headers))
        random_block = bytearray(draw(st.binary(min_size=BLOCK, max_size=BLOCK)))
        if draw(st.booleans()):
            _fix_checksum(random_block, 0)
        data[at:at] = random_block
    if draw(st.booleans()):
        data = data[: draw(st.integers(min_value=0, max_value=len(data)))]
    return bytes(data), seed.expected


def _outcome(call: object) -> str | None:
    try:
        call()  # type: ignore[operator]
    except PackageError as exc:
        assert "\n" not in str(exc), str(exc)
        return str(exc)
    return None


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(case=fuzzed_archives(), strict=st.booleans())
def test_archive_reader_fuzz(case: tuple[bytes, tuple[FileEntry, ...]], strict: bool) -> None:
    data, expected = case
    limits = LIMITS if strict else UnpackLimits()
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "p.tar"
        archive.write_bytes(data)
        with archive.open("rb") as handle:
            checked = _outcome(lambda: check_archive(handle, str(archive), expected, limits))
        unpacked = _outcome(lambda: unpack_archive(archive, expected, Path(tmp) / "u", limits))
        event("accepted" if checked is None else "refused")
        assert checked == unpacked  # verify's check and stage 2 agree, word for word
