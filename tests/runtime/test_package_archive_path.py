"""Every reader of a version folder opens the archive the manifest names, checks each of its
members as the entrypoint's unpack does, and reports an unreadable one in one line."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runtime.cli import app
from runtime.entrypoint.stages import locate, unpack
from runtime.package import (
    MANIFEST_NAME,
    PackageError,
    build_package,
    load_manifest,
    unpack_archive,
    verify_package,
)
from runtime.package.build import file_entry
from tests.runtime.wheelmaker import make_source

runner = CliRunner()


@pytest.fixture
def built(tmp_path: Path) -> Path:
    build_package(make_source(tmp_path / "src"), tmp_path / "out")
    return tmp_path / "out"


def _rename_archive(version: Path, name: str) -> None:
    """Move package.tar to ``name`` and say so in the manifest (its size and sha256 unchanged)."""
    (version / "package.tar").rename(version / name)
    data = json.loads((version / MANIFEST_NAME).read_text())
    data["archive"]["path"] = name
    (version / MANIFEST_NAME).write_text(json.dumps(data))


def test_verify_reads_the_archive_the_manifest_names(built: Path) -> None:
    _rename_archive(built, "pkg.tar")
    for quick in ([], ["--quick"]):
        result = runner.invoke(app, ["package", "verify", *quick, str(built)])
        assert result.exit_code == 0, result.output
        assert result.output == "ok: toy/v1\n"


def test_entrypoint_unpacks_the_archive_it_verified(built: Path, tmp_path: Path) -> None:
    # The manifest names pkg.tar (verified); a package.tar beside it holds other bytes.
    _rename_archive(built, "pkg.tar")
    with (
        tarfile.open(built / "pkg.tar") as good,
        tarfile.open(built / "package.tar", "w", format=tarfile.PAX_FORMAT) as evil,
    ):
        for member in good:
            data = good.extractfile(member).read()  # type: ignore[union-attr]
            if member.name == "tokenizer/tokenizer.json":
                data = data.replace(b"quick", b"EVIL!")
            evil.addfile(member, io.BytesIO(data))
    folder, manifest = locate(
        built, None, tmp_path / "dl", verify_weights=True, expect=(None, None), warn=print
    )
    unpacked = unpack(folder, manifest, tmp_path / "unpacked", 1 << 30)
    tokenizer = (unpacked / "tokenizer" / "tokenizer.json").read_bytes()
    assert b"EVIL!" not in tokenizer and b"quick" in tokenizer


def test_archive_path_of_another_file_is_refused(built: Path) -> None:
    data = json.loads((built / MANIFEST_NAME).read_text())
    data["archive"]["path"] = "weights/config.json"
    (built / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(PackageError, match=r"archive path 'weights/config\.json' is also another"):
        load_manifest(built / MANIFEST_NAME)


def test_unreadable_archive_is_one_error_line(built: Path) -> None:
    # A folder where the archive should be: its size can match for --quick, it is no file.
    _rename_archive(built, "pkg.tar")
    (built / "pkg.tar").rename(built / "kept.tar")
    (built / "pkg.tar").mkdir()
    data = json.loads((built / MANIFEST_NAME).read_text())
    data["archive"]["size"] = (built / "pkg.tar").stat().st_size
    (built / MANIFEST_NAME).write_text(json.dumps(data))
    result = runner.invoke(app, ["package", "verify", "--quick", str(built)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: pkg.tar in ")
    assert "is not a regular file" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_unpack_of_a_missing_archive_is_a_package_error(built: Path, tmp_path: Path) -> None:
    manifest = load_manifest(built / MANIFEST_NAME)
    with pytest.raises(PackageError, match=r"cannot read archive .*missing\.tar"):
        unpack_archive(built / "missing.tar", manifest.archive_files, tmp_path / "u")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("../outside", "member path '../outside' must be normalised and stay inside"),
        ("/abs", "member path '/abs' is absolute"),
    ],
)
def test_verify_refuses_directory_members_the_unpack_refuses(
    built: Path, tmp_path: Path, name: str, expected: str
) -> None:
    archive = built / "package.tar"
    with tarfile.open(archive, "a") as tar:
        folder = tarfile.TarInfo(name)
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
    manifest = load_manifest(built / MANIFEST_NAME)
    sealed = manifest.model_copy(update={"archive": file_entry(archive, "package.tar")})
    (built / MANIFEST_NAME).write_text(sealed.to_json())
    with pytest.raises(PackageError, match=re.escape(expected)):
        unpack_archive(archive, manifest.archive_files, tmp_path / "u")
    with pytest.raises(PackageError, match=re.escape(expected)):
        verify_package(built)
