"""Stage 1 refuses files in the weights folder that the manifest does not list: vLLM loads every
weight file of the folder, so an earlier build's shard left on the model cache would be served
beside the verified ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.entrypoint.errors import StageFailed
from runtime.entrypoint.stages import locate
from runtime.package import PackageError, build_package, verify_package
from tests.runtime.pod import Pod
from tests.runtime.wheelmaker import make_source


def _locate(folder: Path) -> None:
    locate(
        folder,
        None,
        folder.parent / "download",
        verify_weights=False,
        expect=(None, None),
        warn=lambda _: None,
    )


def test_an_unlisted_shard_on_the_model_cache_stops_at_locate(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    (pod.root / "version" / "weights" / "model-00002.safetensors").write_bytes(b"\x01" * 2048)
    code, err = pod.run_to_exit(timeout=30)  # stage 1 takes well under a second
    assert code == 11, err
    (line,) = [line for line in err.splitlines() if " failed: " in line]
    assert "stage 1/8 locate failed: " in line
    assert "weights/model-00002.safetensors, which the manifest does not list" in line
    assert "; fix: delete them from s3://<bucket>/models/toy/v1/" in line
    assert "started" not in err  # refused before any server ran


def test_nested_files_and_folder_links_are_named(tmp_path: Path) -> None:
    folder = tmp_path / "version"
    build_package(make_source(tmp_path / "src"), folder)
    _locate(folder)  # the build as made: every file listed
    (folder / "weights" / "extra").mkdir()
    (folder / "weights" / "extra" / "b.safetensors").write_bytes(b"x")
    (folder / "weights" / "linked").symlink_to(tmp_path / "src")
    with pytest.raises(StageFailed) as refused:
        _locate(folder)
    message = str(refused.value)
    assert "weights/extra/b.safetensors, weights/linked, which the manifest" in message


def test_package_verify_refuses_an_unlisted_weight_file(tmp_path: Path) -> None:
    """What the materialize Job's verify container runs: it refuses the folder before any
    server of the version is scheduled, as stage 1 would after."""
    folder = tmp_path / "version"
    build_package(make_source(tmp_path / "src"), folder)
    verify_package(folder, full=False)
    (folder / "weights" / "model-00002.safetensors").write_bytes(b"x")
    with pytest.raises(PackageError, match=r"holds weights/model-00002\.safetensors, which"):
        verify_package(folder, full=False)
