"""``engine_args.logits_processors`` is a list of ``module:Class`` names (what vLLM loads),
refused at build time otherwise, and rendered into ``model.json`` name by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.entrypoint.render import engine_arguments
from runtime.package import MANIFEST_NAME, PackageError, build_package, load_manifest
from tests.runtime.wheelmaker import make_source

# The processor the entrypoint adds; not an installed entry point, so it stays in the list.
OURS = "extra.processors:Added"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("my_pkg.procs:BanWords", "must be a list of 'module:Class' names, not str"),
        (["my_pkg.procs.BanWords"], "logits_processors.0 is 'my_pkg.procs.BanWords', not a"),
        (["a:b:C"], "logits_processors.0 is 'a:b:C', not a 'module:Class' name"),
        (["ok.mod:Cls", 3], "logits_processors.1 is 3, not a 'module:Class' name"),
        ([":Cls"], "logits_processors.0 is ':Cls'"),
    ],
)
def test_build_refuses_what_vllm_cannot_load(tmp_path: Path, value: object, expected: str) -> None:
    args = {"max_model_len": 128, "logits_processors": value}
    source = make_source(tmp_path / "src", engine_args=args)
    with pytest.raises(PackageError) as err:
        build_package(source, tmp_path / "out")
    assert "field engine_args" in str(err.value) and expected in str(err.value)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_hand_written_string_is_refused_when_read(tmp_path: Path) -> None:
    build_package(make_source(tmp_path / "src"), tmp_path / "out")
    path = tmp_path / "out" / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["engine_args"]["logits_processors"] = "my_pkg.procs:BanWords"
    path.write_text(json.dumps(data))
    with pytest.raises(PackageError, match="logits_processors must be a list"):
        load_manifest(path)


def test_named_processors_reach_model_json_whole(tmp_path: Path) -> None:
    names = ["my_pkg.procs:BanWords", "other.mod:Outer.Inner"]
    args = {"max_model_len": 128, "logits_processors": names}
    manifest = build_package(make_source(tmp_path / "src", engine_args=args), tmp_path / "out")
    rendered = engine_arguments(manifest, tmp_path / "out", tmp_path / "unpacked", OURS)
    assert rendered["logits_processors"] == [*names, OURS]
