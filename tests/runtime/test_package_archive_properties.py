"""Properties over generated archives and source trees with hostile names, types, modes,
depths and counts: build, verify and unpack end in success or one `PackageError` line, never
another exception, and what verify passes (with or without --quick) stage 2 unpacks."""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from runtime.package import (
    MANIFEST_NAME,
    PackageError,
    UnpackLimits,
    build_package,
    load_manifest,
    unpack_archive,
    verify_package,
)
from tests.runtime.archivemaker import Member, add_and_seal
from tests.runtime.wheelmaker import make_source

# Path pieces chosen to break rules: traversal, empty and dot parts, separators and control
# characters, non-ASCII, names near the length limits, and the base package's own paths.
_PARTS = st.one_of(
    st.sampled_from(["a", "b.json", "..", ".", "", "é", "a\\b", "x\ny", "nul\x00", "tokenizer"]),
    st.text(alphabet="ab.-_ é\\\t", min_size=1, max_size=6),
    st.integers(min_value=20, max_value=40).map(lambda n: "L" * n),
)
_NAMES = st.one_of(
    st.lists(_PARTS, min_size=1, max_size=6).map("/".join),
    st.sampled_from(
        [
            "/etc/cron.d/x",
            "tokenizer/tokenizer.json",  # already in the archive
            "catalogs/titles.jsonl/under-a-file",
            "tokenizer/",
            "/",
        ]
    ),
    st.integers(min_value=1, max_value=12).map(lambda depth: "d/" * depth + "f"),
)
_TYPES = st.sampled_from(
    [
        tarfile.REGTYPE,
        tarfile.AREGTYPE,
        tarfile.CONTTYPE,
        tarfile.DIRTYPE,
        tarfile.SYMTYPE,
        tarfile.LNKTYPE,
        tarfile.CHRTYPE,
        tarfile.BLKTYPE,
        tarfile.FIFOTYPE,
        b"V",
        b"Z",
    ]
)
_MODES = st.sampled_from([0o644, 0o755, 0o4755, 0o2755, 0o6755, 0o1755, 0o7777, 0])


@st.composite
def _members(draw: st.DrawFn) -> Member:
    info = tarfile.TarInfo(draw(_NAMES))
    info.type, info.mode = draw(_TYPES), draw(_MODES)
    if info.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        info.linkname = draw(st.sampled_from(["/etc/passwd", "../x", "tokenizer/tokenizer.json"]))
    data = draw(st.binary(max_size=700)) if info.isreg() else b""
    info.size = len(data)
    return info, data


# Small limits, so that counts, depths and lengths are crossed with a handful of members; the
# base package has 3 files at 2 levels, with names up to 31 bytes and paths up to 39.
_LIMITS = st.builds(
    UnpackLimits,
    max_members=st.integers(min_value=3, max_value=9),
    max_path_bytes=st.sampled_from([40, 1024]),
    max_name_bytes=st.sampled_from([31, 255]),
    max_depth=st.sampled_from([2, 4, 32]),
    max_header_bytes=st.sampled_from([1024, 64 << 10]),
)


@pytest.fixture(scope="module")
def base_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_source(tmp_path_factory.mktemp("base") / "src")


@pytest.fixture(scope="module")
def base_version(base_source: Path) -> Path:
    build_package(base_source, base_source.parent / "out")
    return base_source.parent / "out"


def _outcome(call: object) -> str | None:
    """None if ``call()`` passed, else its `PackageError` message (which must be one line)."""
    try:
        call()  # type: ignore[operator]
    except PackageError as exc:
        assert "\n" not in str(exc), str(exc)
        return str(exc)
    return None


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    extra=st.lists(_members(), max_size=6),
    listed=st.booleans(),
    limits=_LIMITS,
    full=st.booleans(),
)
def test_what_verify_passes_stage_2_unpacks(
    base_version: Path, extra: list[Member], listed: bool, limits: UnpackLimits, full: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        version = Path(tmp) / "version"
        shutil.copytree(base_version, version)
        add_and_seal(version, extra, listed=listed)
        verified = _outcome(lambda: verify_package(version, full=full, limits=limits))
        try:
            manifest = load_manifest(version / MANIFEST_NAME)
        except PackageError:
            assert verified is not None  # stage 1 refuses it as well
            return
        archive = version / manifest.archive.path
        dest = Path(tmp) / "unpacked"
        unpacked = _outcome(lambda: unpack_archive(archive, manifest.archive_files, dest, limits))
        event("verify passed" if verified is None else "verify refused")
        if unpacked is not None:
            assert verified == unpacked  # the same check refused it, in the same words
        if verified is None:
            assert unpacked is None
            for entry in manifest.archive_files:
                assert (dest / entry.path).stat().st_size == entry.size
            written = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
            assert written == {entry.path for entry in manifest.archive_files}


# Mostly names a build takes, so that some versions get written and checked end to end.
_SOURCE_PARTS = st.one_of(
    st.text(alphabet="abc.-_é", min_size=1, max_size=8).filter(lambda p: p not in (".", "..")),
    st.text(alphabet="ab \\\n\t", min_size=1, max_size=4),
    st.integers(min_value=200, max_value=255).map(lambda n: "L" * n),
    st.just(os.fsdecode(b"caf\xe9")),  # not UTF-8
)
_SOURCE_KINDS = st.sampled_from(["file"] * 6 + ["fifo", "symlink_in", "symlink_out", "hardlink"])
_SOURCE_MODES = st.sampled_from([0o644] * 6 + [0o755, 0o4755, 0o2755, 0o1755])


@st.composite
def _source_files(draw: st.DrawFn) -> tuple[list[str], str, int]:
    depth = draw(st.sampled_from([1, 2, 3, 5, 31, 32, 36]))  # tokenizer/ adds one level
    parts = [draw(_SOURCE_PARTS) if i < 3 else "d" for i in range(depth)]
    return parts, draw(_SOURCE_KINDS), draw(_SOURCE_MODES)


def _plant(folder: Path, parts: list[str], kind: str, mode: int) -> None:
    path = folder.joinpath(*parts)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            return
        if kind == "file":
            path.write_bytes(b"{}")
            os.chmod(path, mode)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "symlink_in":
            path.symlink_to(folder / "tokenizer.json")
        elif kind == "symlink_out":
            path.symlink_to("/etc/hostname")
        else:
            os.link(folder / "tokenizer.json", path)
    except (NotADirectoryError, FileExistsError, IsADirectoryError):
        return  # a file where this one's folder would be: the tree just lacks it


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow])
@given(files=st.lists(_source_files(), max_size=4))
def test_build_refuses_or_writes_what_verify_and_stage_2_accept(
    base_source: Path, files: list[tuple[list[str], str, int]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "src"
        shutil.copytree(base_source, source)
        for parts, kind, mode in files:
            _plant(source / "tokenizer", parts, kind, mode)
        out = Path(tmp) / "out"
        built = _outcome(lambda: build_package(source, out))
        event("build refused" if built is not None else "build wrote the version")
        if built is not None:
            assert not out.exists()
            return
        assert _outcome(lambda: verify_package(out)) is None
        assert _outcome(lambda: verify_package(out, full=False)) is None
        manifest = load_manifest(out / MANIFEST_NAME)
        dest = Path(tmp) / "unpacked"
        assert (
            _outcome(lambda: unpack_archive(out / "package.tar", manifest.archive_files, dest))
            is None
        )
        for entry in manifest.archive_files:
            unpacked = dest / entry.path
            assert unpacked.read_bytes() == (source / entry.path).read_bytes()
            assert not stat.S_IMODE(unpacked.stat().st_mode) & (stat.S_ISUID | stat.S_ISGID)
