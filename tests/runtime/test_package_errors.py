"""Broken source trees, wheels and archives are refused with one `PackageError`, no traceback."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runtime.cli import app
from runtime.package import PackageError, build_package, verify_package
from tests.runtime.wheelmaker import make_source

WHEEL = "plugins/toy_plugin-1.0-py3-none-any.whl"


def _dangling_symlink(source: Path) -> None:
    (source / "tokenizer" / "vocab.json").symlink_to(source / "tokenizer" / "gone.json")


def _symlink_loop(source: Path) -> None:
    (source / "tokenizer" / "loop.json").symlink_to(source / "tokenizer" / "loop.json")


def _latin1_metadata(source: Path) -> None:
    with zipfile.ZipFile(source / WHEEL, "w") as wheel:
        wheel.writestr("toy_plugin-1.0.dist-info/METADATA", b"Name: toy-plugin\nVersion: 1.0\n\xe9")


def _not_a_zip(source: Path) -> None:
    (source / WHEEL).write_bytes(b"PK not really a zip file" * 10)


def _damaged_zip_member(source: Path) -> None:
    data = bytearray((source / WHEEL).read_bytes())
    data[data.index(b"Metadata-Version")] ^= 0x01  # the member's CRC no longer matches
    (source / WHEEL).write_bytes(bytes(data))


def _backslash_name(source: Path) -> None:
    (source / "tokenizer" / "added\\tokens.json").write_text("{}")


def _undecodable_name(source: Path) -> None:
    # A file name that is not UTF-8 (Latin-1 bytes), which a JSON manifest cannot carry.
    (Path(os.fsdecode(os.fsencode(source / "tokenizer") + b"/caf\xe9.json"))).write_text("{}")


def _newline_name(source: Path) -> None:
    (source / "weights" / "shard\n1.safetensors").write_bytes(b"\x00")


def _backslash_weight(source: Path) -> None:
    (source / "weights" / "shard\\1.safetensors").write_bytes(b"\x00")


@pytest.mark.parametrize(
    ("mutate", "expected", "advice"),
    [
        (
            _dangling_symlink,
            "tokenizer: tokenizer/vocab.json is a dangling symlink (-> ",
            "remove it or point it at a file inside the package",
        ),
        (
            _symlink_loop,
            "tokenizer: tokenizer/loop.json is a symlink loop",
            "remove it or point it at a file inside the package",
        ),
        (
            _latin1_metadata,
            f"plugin wheel {WHEEL}: toy_plugin-1.0.dist-info/METADATA is not UTF-8",
            "rebuild the wheel with UTF-8 metadata",
        ),
        (
            _not_a_zip,
            f"plugin wheel {WHEEL} cannot be read as a wheel (File is not a zip file)",
            "rebuild it (pip wheel or python -m build) or drop it from plugins",
        ),
        (
            _damaged_zip_member,
            f"plugin wheel {WHEEL} cannot be read as a wheel (Bad CRC-32",
            "rebuild it (pip wheel or python -m build) or drop it from plugins",
        ),
        (
            _backslash_name,
            "tokenizer: file 'tokenizer/added\\\\tokens.json' cannot be packaged",
            "rename it",
        ),
        (
            _backslash_weight,
            "weights: file 'weights/shard\\\\1.safetensors' cannot be packaged",
            "rename it",
        ),
        (_undecodable_name, "is not printable UTF-8", "rename it"),
        (_newline_name, "is not printable UTF-8", "rename it"),
    ],
    ids=[
        "dangling_symlink",
        "symlink_loop",
        "latin1_metadata",
        "not_a_zip",
        "damaged_zip_member",
        "backslash_name",
        "backslash_weight",
        "undecodable_name",
        "newline_name",
    ],
)
def test_broken_source_is_one_package_error(
    tmp_path: Path, mutate: Callable[[Path], None], expected: str, advice: str
) -> None:
    source = make_source(tmp_path / "src")
    mutate(source)
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    assert expected in str(err.value) and advice in str(err.value)


@pytest.fixture
def built(tmp_path: Path) -> Path:
    build_package(make_source(tmp_path / "src"), tmp_path / "out")
    return tmp_path / "out"


def _same_size_garbage(archive: Path) -> None:
    data = bytearray(archive.read_bytes())
    data[:512] = b"\x07" * 512  # the first member's header
    archive.write_bytes(bytes(data))


def _rename_plugin_member(archive: Path) -> None:
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    size = archive.stat().st_size
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for member, data in members:
            if member.name == WHEEL:
                member.name = WHEEL.replace("plugins/", "pluginz/")
            tar.addfile(member, io.BytesIO(data))
    assert archive.stat().st_size == size  # so only the member checks can tell, not its size


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (_same_size_garbage, "package.tar is corrupt (invalid header); publish or restore it"),
        (
            _rename_plugin_member,
            f"archive member {WHEEL.replace('plugins/', 'pluginz/')} (",
        ),
    ],
    ids=["same_size_garbage", "renamed_plugin_member"],
)
def test_quick_verify_of_a_damaged_archive_is_one_package_error(
    built: Path, damage: Callable[[Path], None], expected: str
) -> None:
    damage(built / "package.tar")
    with pytest.raises(PackageError) as err:
        verify_package(built, full=False)
    assert expected in str(err.value)
    result = CliRunner().invoke(app, ["package", "verify", "--quick", str(built)])
    assert result.exit_code == 1 and result.output.startswith("error: ")
    assert len(result.output.strip().splitlines()) == 1


def test_symlink_loop_named_as_the_tokenizer_folder_is_one_package_error(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    os.symlink("tok", source / "tok")
    (source / "package.yaml").write_text((source / "package.yaml").read_text() + "tokenizer: tok\n")
    with pytest.raises(PackageError, match="tokenizer: tok is a symlink loop"):
        build_package(source, tmp_path / "out")
