"""``package verify --jobs N`` hashes files concurrently yet fails exactly as one at a time does:
the same file, the same check, the first failing file in manifest order, no thread left behind."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest
from typer.testing import CliRunner, Result

from runtime.cli import app
from runtime.package import (
    MANIFEST_NAME,
    PackageError,
    build_package,
    load_manifest,
    verify_package,
)
from tests.runtime.wheelmaker import make_source

SHARDS = 8
BIG = "weights/a-big.safetensors"  # the first weight file in manifest order, after the archive
BIG_BYTES = 16 << 20


@pytest.fixture
def built(tmp_path: Path) -> Path:
    """The toy package with more weight files than the threads of the tests, and one big one."""
    source = make_source(tmp_path / "src")
    for i in range(SHARDS):
        (source / "weights" / f"shard-{i}.safetensors").write_bytes(bytes([i]) * (64 << 10))
    (source / BIG).write_bytes(b"\x07" * BIG_BYTES)
    build_package(source, tmp_path / "out")
    return tmp_path / "out"


def _rewrite(path: Path, data: bytes) -> None:
    path.unlink()  # the build may hard-link the source's file
    path.write_bytes(data)


def _flip_byte(built: Path) -> None:
    path = built / "weights" / "shard-3.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    _rewrite(path, bytes(data))


def _truncate(built: Path) -> None:
    path = built / "weights" / "shard-5.safetensors"
    _rewrite(path, path.read_bytes()[:-1])


def _remove(built: Path) -> None:
    (built / "weights" / "shard-6.safetensors").unlink()


def _replace_by_folder(built: Path) -> None:
    (built / "weights" / "config.json").unlink()
    (built / "weights" / "config.json").mkdir()


def _verify(built: Path, *options: str) -> Result:
    return CliRunner().invoke(app, ["package", "verify", *options, str(built)])


def test_intact_version_passes_with_jobs(built: Path) -> None:
    result = _verify(built, "--jobs", "4")
    assert result.exit_code == 0, result.output
    assert "ok: toy/v1" in result.output


@pytest.mark.parametrize(
    ("corrupt", "said"),
    [
        (_flip_byte, "error: checksum mismatch for weights/shard-3.safetensors: sha256 "),
        (_truncate, "error: weights/shard-5.safetensors is 65535 bytes, the manifest says 65536"),
        (_remove, "error: weights/shard-6.safetensors is missing from "),
        (_replace_by_folder, "error: weights/config.json in "),
    ],
)
def test_jobs_4_fails_exactly_as_jobs_1(
    built: Path, corrupt: Callable[[Path], None], said: str
) -> None:
    corrupt(built)
    one, four = _verify(built, "--jobs", "1"), _verify(built, "--jobs", "4")
    assert (one.exit_code, four.exit_code) == (1, 1), (one.output, four.output)
    assert four.output == one.output == _verify(built).output
    assert four.output.startswith(said), four.output
    assert len(four.output.strip().splitlines()) == 1


def test_the_first_failing_file_in_manifest_order_is_reported(built: Path) -> None:
    # The first file to fail in manifest order is the big one, corrupt only in its last byte:
    # every later shard, one byte short, fails long before the big file's hash is done.
    _rewrite(built / BIG, b"\x07" * (BIG_BYTES - 1) + b"\x00")
    entries = load_manifest(built / MANIFEST_NAME).weight_files
    assert entries[0].path == BIG
    for entry in entries[1:]:
        if entry.path.startswith("weights/shard-"):
            _rewrite(built / entry.path, (built / entry.path).read_bytes()[:-1])
    for _ in range(5):
        with pytest.raises(PackageError, match=f"checksum mismatch for {re.escape(BIG)}:"):
            verify_package(built, jobs=SHARDS)


class _SlowReads:
    """A file whose reads each take 50 ms and are counted: a stand-in for a multi-GiB shard
    that FSx loads from S3 as it is read."""

    def __init__(self, handle: IO[bytes], counted: list[int]) -> None:
        self._handle = handle
        self._counted = counted

    def read(self, size: int = -1) -> bytes:
        time.sleep(0.05)
        data = self._handle.read(size)
        self._counted.append(len(data))
        return data

    def __enter__(self) -> _SlowReads:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()


def test_a_failure_stops_the_other_reads_and_leaves_no_thread(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (built / "package.tar").unlink()  # the first file in manifest order, the big one next
    counted: list[int] = []
    real_open = Path.open

    def spying_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        handle = real_open(self, *args, **kwargs)
        return _SlowReads(handle, counted) if self.name == Path(BIG).name else handle

    monkeypatch.setattr(Path, "open", spying_open)
    with pytest.raises(PackageError, match=r"package\.tar is missing"):
        verify_package(built, jobs=4)
    # Read to its end, the big file would take 16 reads of 1 MiB (0.8 s of sleeps).
    assert sum(counted) < BIG_BYTES, f"the big file was read to its end: {sum(counted)} bytes"
    assert not [t for t in threading.enumerate() if t.name.startswith("package-verify")]


def test_jobs_below_1_are_refused(built: Path) -> None:
    result = _verify(built, "--jobs", "0")
    assert result.exit_code == 2
    assert "--jobs" in result.output
    with pytest.raises(ValueError, match="jobs must be at least 1, got 0"):
        verify_package(built, jobs=0)
