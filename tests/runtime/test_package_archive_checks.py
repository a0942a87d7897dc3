"""One set of archive member checks: what ``package verify`` passes (with or without
``--quick``), ``package build`` writes and the pod's stage 2 unpacks are the same archives, and
each refusal is one `PackageError` line naming the member by its path and the rule."""

from __future__ import annotations

import dataclasses
import os
import re
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runtime.cli import app
from runtime.entrypoint.settings import EntrypointSettings
from runtime.entrypoint.stages import unpack
from runtime.package import (
    MANIFEST_NAME,
    PackageError,
    UnpackLimits,
    build_package,
    load_manifest,
    unpack_archive,
    verify_package,
)
from runtime.package.manifest import FileEntry
from tests.runtime.archivemaker import (
    Member,
    add_and_seal,
    file_member,
    typed_member,
    write_members,
)
from tests.runtime.wheelmaker import make_source

README = Path(__file__).resolve().parents[2] / "docs" / "packaging.md"
runner = CliRunner()


@pytest.fixture
def built(tmp_path: Path) -> Path:
    build_package(make_source(tmp_path / "src"), tmp_path / "out")
    return tmp_path / "out"


def _refusals(version: Path, dest: Path, limits: UnpackLimits | None = None) -> list[str]:
    """What verify (full, then --quick) and stage 2's unpack say of the version, in one line
    each; every one must refuse it."""
    said = []
    for full in (True, False):
        with pytest.raises(PackageError) as err:
            verify_package(version, full=full, limits=limits)
        said.append(str(err.value))
    manifest = load_manifest(version / MANIFEST_NAME)
    with pytest.raises(PackageError) as err:
        if limits is None:
            unpack(version, manifest, dest, UnpackLimits().max_total_bytes)
        else:
            unpack_archive(version / manifest.archive.path, manifest.archive_files, dest, limits)
    said.append(str(err.value))
    assert all("\n" not in line for line in said), said
    return said


@pytest.mark.parametrize(
    ("member", "expected"),
    [
        (file_member("../outside.txt"), "member path '../outside.txt' must be normalised"),
        (file_member("/etc/cron.d/x"), "member path '/etc/cron.d/x' is absolute"),
        (
            typed_member("tokenizer/evil.json", tarfile.SYMTYPE, "/etc/passwd"),
            "archive member tokenizer/evil.json is a link (-> /etc/passwd)",
        ),
        (
            typed_member("tokenizer/hard.json", tarfile.LNKTYPE, "tokenizer/tokenizer.json"),
            "archive member tokenizer/hard.json is a link (-> tokenizer/tokenizer.json)",
        ),
        (
            typed_member("tokenizer/dev", tarfile.CHRTYPE),
            "archive member tokenizer/dev is a device, fifo or other special file",
        ),
    ],
    ids=["parent", "absolute", "symlink", "hardlink", "device"],
)
def test_quick_verify_checks_every_member(built: Path, member: Member, expected: str) -> None:
    add_and_seal(built, [member])  # the archive's size and sha256 match: only members can tell
    for quick in (["--quick"], []):
        result = runner.invoke(app, ["package", "verify", *quick, str(built)])
        assert result.exit_code == 1, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), lines
        assert expected in lines[0]


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("tokenizer/" + "n" * 9_990, "has a 10000-byte path, over the 1024 a package may use"),
        ("d/" * 3_000 + "f.json", "has a 6006-byte path, over the 1024 a package may use"),
        ("d/" * 40 + "f.json", "is 41 levels deep, over the 32 a package may use"),
        ("tokenizer/" + "é" * 128 + ".json", "has a name of 261 bytes, over the 255"),
    ],
    ids=["10000_chars", "3000_folders", "41_levels", "long_component"],
)
def test_verify_refuses_what_stage_2_refuses(
    built: Path, tmp_path: Path, name: str, rule: str
) -> None:
    add_and_seal(built, [file_member(name)])  # listed in the manifest, size and sha256 right
    said = _refusals(built, tmp_path / "unpacked")
    assert len(set(said)) == 1, said  # the same check, in the same words
    assert said[0].startswith("archive member ") and rule in said[0]
    assert len(said[0]) < 600  # a 10,000-character name is shown cut in the middle
    assert not (tmp_path / "unpacked" / "d").exists()


def test_folder_entries_count_against_the_member_limit(built: Path, tmp_path: Path) -> None:
    files = len(load_manifest(built / MANIFEST_NAME).archive_files)
    limits = UnpackLimits(max_members=files + 2)
    folders = [typed_member(f"tokenizer/extra{i}", tarfile.DIRTYPE) for i in range(3)]
    add_and_seal(built, folders)
    said = _refusals(built, tmp_path / "unpacked", limits)
    assert len(set(said)) == 1, said
    assert f"has more than {files + 2} members, folder entries included" in said[0]
    assert "member tokenizer/extra2 is one too many" in said[0]


@pytest.mark.parametrize("mode", [0o4755, 0o2755, 0o6755])
@pytest.mark.parametrize("kind", ["file", "folder"])
def test_setuid_and_setgid_members_are_refused(
    built: Path, tmp_path: Path, mode: int, kind: str
) -> None:
    name = "tokenizer/run.sh" if kind == "file" else "tokenizer/bin"
    member = file_member(name, b"#!/bin/sh\n", mode)
    if kind == "folder":
        member = typed_member(name, tarfile.DIRTYPE, mode=mode)
    add_and_seal(built, [member])
    said = _refusals(built, tmp_path / "unpacked")
    assert len(set(said)) == 1, said
    assert f"archive member {name} has mode {mode:#o}, with the setuid or setgid bit" in said[0]


@pytest.mark.parametrize("mode", [0o4755, 0o2755])
def test_build_refuses_a_setuid_or_setgid_source_file(tmp_path: Path, mode: int) -> None:
    source = make_source(tmp_path / "src")
    (source / "tokenizer" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(source / "tokenizer" / "run.sh", mode)
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    assert f"tokenizer: tokenizer/run.sh has the setuid or setgid bit (mode {mode:#o})" in str(
        err.value
    )
    assert not (tmp_path / "out").exists()


def test_build_refuses_what_stage_2_would(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src")
    deep = source / "tokenizer" / Path(*["d"] * 32)
    deep.mkdir(parents=True)
    (deep / "f.json").write_text("{}")
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    assert str(err.value).startswith("archive member tokenizer/d/d/")
    assert "is 34 levels deep, over the 32 a package may use (UnpackLimits.max_depth)" in str(
        err.value
    )
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.*"))  # the staging folder is gone too


def _cut(version: Path, keep: int) -> Path:
    archive = version / "package.tar"
    archive.write_bytes(archive.read_bytes()[:keep])
    return archive


def _data_of(version: Path, name: str) -> tuple[int, int]:
    with tarfile.open(version / "package.tar") as tar:
        member = tar.getmember(name)
        return member.offset_data, member.size


@pytest.mark.parametrize("where", ["data", "padding"])
def test_archive_ending_inside_a_member_names_it(built: Path, tmp_path: Path, where: str) -> None:
    name = "tokenizer/tokenizer.json"
    offset, size = _data_of(built, name)
    assert size % tarfile.BLOCKSIZE, "the member needs padding for this test"
    archive = _cut(built, offset + (size // 2 if where == "data" else size + 1))
    entries = load_manifest(built / MANIFEST_NAME).archive_files
    with pytest.raises(PackageError) as err:
        unpack_archive(archive, entries, tmp_path / "unpacked")
    assert f"archive {archive} ends inside member {name} (its blocks run to byte " in str(err.value)
    assert not (tmp_path / "unpacked" / "tokenizer").exists()


def test_archive_cut_between_members_names_the_last_one(built: Path, tmp_path: Path) -> None:
    entries = load_manifest(built / MANIFEST_NAME).archive_files
    with tarfile.open(built / "package.tar") as tar:
        members = tar.getmembers()
    last = members[-1]
    archive = _cut(built, last.offset_data + -(-last.size // 512) * 512)  # no end-of-archive
    with pytest.raises(PackageError) as err:
        unpack_archive(archive, entries, tmp_path / "unpacked")
    assert f"ends after member {last.name} (byte " in str(err.value)


def test_archive_ending_inside_extended_headers_says_where(tmp_path: Path) -> None:
    name = "tokenizer/" + "x" * 200  # a pax path record
    archive = write_members(tmp_path / "p.tar", [file_member("a.txt"), file_member(name)])
    with tarfile.open(archive) as tar:
        second = tar.getmembers()[1].offset  # where its pax header begins
    archive.write_bytes(archive.read_bytes()[: second + tarfile.BLOCKSIZE + 10])
    with pytest.raises(PackageError) as err:
        unpack_archive(archive, _entries("a.txt", name), tmp_path / "dest")
    assert f"ends inside the headers of the member at byte {second} (after member a.txt)" in str(
        err.value
    )


def _entries(*names: str) -> list[FileEntry]:
    return [FileEntry(path=n, size=3, sha256="0" * 64) for n in names]


_RAISED = UnpackLimits(max_path_bytes=1 << 20, max_depth=1 << 20, max_name_bytes=1 << 20)


def test_deep_path_under_raised_limits_unpacks_without_recursion(tmp_path: Path) -> None:
    # os.makedirs recurses once per missing folder: 1,100 of them raised RecursionError.
    name = "d/" * 1_100 + "f.json"
    archive = write_members(tmp_path / "p.tar", [file_member(name)])
    dest = tmp_path / "dest"
    unpack_archive(archive, _entries(name), dest, _RAISED)
    assert (dest / name).read_bytes() == b"abc"
    (dest / name).unlink()
    for level in range(1_100, 0, -1):  # rmtree, too, recurses once per level
        (dest / "/".join(["d"] * level)).rmdir()


@pytest.mark.parametrize(
    "name", ["n" * 300, ("d" * 250 + "/") * 20 + "f.json"], ids=["component", "path"]
)
def test_name_the_file_system_refuses_is_a_package_error(tmp_path: Path, name: str) -> None:
    # Under raised limits the file system refuses (ENAMETOOLONG): still one line naming it.
    archive = write_members(tmp_path / "p.tar", [file_member(name)])
    with pytest.raises(PackageError) as err:
        unpack_archive(archive, _entries(name), tmp_path / "dest", _RAISED)
    message = str(err.value)
    assert message.startswith(f"writing archive member {name[:60]}...")
    assert "File name too long" in message and "\n" not in message


@pytest.mark.parametrize(
    ("members", "expected"),
    [
        (
            [file_member("a.txt"), typed_member("a.txt", tarfile.DIRTYPE)],
            "has a.txt twice",
        ),
        (
            [typed_member("a.txt/x", tarfile.DIRTYPE), file_member("a.txt")],
            "archive member a.txt is a file, but the archive holds members under it",
        ),
        (
            [file_member("a.txt"), typed_member("a.txt/x", tarfile.DIRTYPE)],
            "archive member a.txt/x lies under a.txt, a file in the archive",
        ),
    ],
    ids=["file_and_folder", "folder_then_file", "folder_under_file"],
)
def test_paths_are_files_or_folders_not_both(
    tmp_path: Path, members: list[Member], expected: str
) -> None:
    archive = write_members(tmp_path / "p.tar", members)
    with pytest.raises(PackageError, match=re.escape(expected)):
        unpack_archive(archive, _entries("a.txt"), tmp_path / "dest")


def test_limits_are_the_pods_and_documented() -> None:
    # verify checks the default limits; stage 2 takes the byte ceiling from its settings.
    default = EntrypointSettings.model_fields["max_unpack_bytes"].default
    assert default == UnpackLimits().max_total_bytes
    section = README.read_text().split("## The archive check")[1]
    section = section.split("\n## ")[0]
    for field in dataclasses.fields(UnpackLimits):
        assert f"`{field.name}`" in section, f"README's package section omits {field.name}"
