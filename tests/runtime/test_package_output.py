"""A build writes its version folder in one step: a refused or failed build leaves nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from runtime.package import MANIFEST_NAME, PackageError, build_package, load_manifest
from runtime.package import build as build_module
from tests.runtime.wheelmaker import make_source, write_catalog


def _edit_spec(source: Path, **changes: object) -> None:
    spec = yaml.safe_load((source / "package.yaml").read_text())
    spec.update(changes)
    (source / "package.yaml").write_text(yaml.safe_dump(spec))


def _bad_model_id(source: Path) -> Callable[[], None]:
    _edit_spec(source, model_id="Toy_Model")
    return lambda: _edit_spec(source, model_id="toy")


def _bad_model_version(source: Path) -> Callable[[], None]:
    _edit_spec(source, model_version="v1/beta")
    return lambda: _edit_spec(source, model_version="v1")


def _reserved_engine_arg(source: Path) -> Callable[[], None]:
    _edit_spec(source, engine_args={"max_model_len": 128, "tokenizer": "/elsewhere"})
    return lambda: _edit_spec(source, engine_args={"max_model_len": 128})


def _weights_symlink_out_of_the_root(source: Path) -> Callable[[], None]:
    outside = source.parent / "outside.bin"
    outside.write_bytes(b"\x01" * 64)
    link = source / "weights" / "extra.bin"
    link.symlink_to(outside)
    return link.unlink


def _duplicate_catalog_name(source: Path) -> Callable[[], None]:
    write_catalog(source / "catalogs" / "other.jsonl", {"o1": "fox"})
    spec = yaml.safe_load((source / "package.yaml").read_text())
    first = spec["catalogs"]
    _edit_spec(source, catalogs=[*first, {"name": "titles", "path": "catalogs/other.jsonl"}])
    return lambda: _edit_spec(source, catalogs=first)


@pytest.mark.parametrize(
    ("break_spec", "expected"),
    [
        (_bad_model_id, "field model_id: String should match pattern"),
        (_bad_model_version, "field model_version: String should match pattern"),
        (_reserved_engine_arg, "engine_args must not set tokenizer"),
        (_weights_symlink_out_of_the_root, "weights/extra.bin is a symlink out of the package"),
        (_duplicate_catalog_name, "duplicate catalog name: titles"),
    ],
    ids=["model_id", "model_version", "engine_args", "weights_symlink", "catalog_name"],
)
def test_refused_build_leaves_nothing_and_a_rerun_succeeds(
    tmp_path: Path, break_spec: Callable[[Path], Callable[[], None]], expected: str
) -> None:
    source = make_source(tmp_path / "src")
    repair = break_spec(source)
    out = tmp_path / "versions" / "v1"
    with pytest.raises(PackageError, match=expected):
        build_package(source, out)
    assert not out.exists()
    assert not (tmp_path / "versions").exists() or not any((tmp_path / "versions").iterdir())
    repair()
    manifest = build_package(source, out)
    assert load_manifest(out / MANIFEST_NAME) == manifest


def test_failure_while_writing_removes_the_partial_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make_source(tmp_path / "src")
    out = tmp_path / "versions" / "v1"
    seen: list[bool] = []

    def disk_full(files: object, staging: Path) -> object:
        seen.append(out.exists())
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(build_module, "_place_weights", disk_full)
    with pytest.raises(PackageError, match=r"writing .*v1 failed: \[Errno 28\] No space left"):
        build_package(source, out)
    assert seen == [False]  # the archive was written elsewhere, not in the output folder
    assert list((tmp_path / "versions").iterdir()) == []


def test_interrupted_build_removes_the_partial_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make_source(tmp_path / "src")

    def interrupted(*args: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(build_module, "file_entry", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_package(source, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_existing_empty_output_folder_is_filled(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    manifest = build_package(make_source(tmp_path / "src"), out)
    assert load_manifest(out / MANIFEST_NAME) == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]


def test_relative_output_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = make_source(tmp_path / "src")
    monkeypatch.chdir(tmp_path)
    build_package(source, Path("out"))
    assert (tmp_path / "out" / MANIFEST_NAME).is_file()
