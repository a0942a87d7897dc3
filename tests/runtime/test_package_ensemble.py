"""Ensemble packages: a python pre-processing step, a tree model and a python post-processing
step chained by Triton's ensemble scheduler, with the tensor flow checked at build time."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from runtime.package import PackageError, build_package, verify_package
from tests.runtime.modelmaker import FEATURES, ensemble_source


def _parse(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def test_ensemble_repository(tmp_path: Path) -> None:
    manifest = build_package(ensemble_source(tmp_path / "src"), tmp_path / "v")
    repo = tmp_path / "v" / "model_repository"
    assert sorted(p.name for p in repo.iterdir()) == ["post", "pre", "tab", "trees"]
    assert (repo / "tab" / "1").is_dir()  # Triton requires an ensemble's version folder
    assert sorted(p.name for p in (repo / "pre" / "1").iterdir()) == ["helpers.py", "model.py"]
    config = _parse(repo / "tab" / "config.pbtxt")
    assert config.platform == "ensemble" and config.max_batch_size == 32
    steps = [
        (s.model_name, s.model_version, dict(s.input_map), dict(s.output_map))
        for s in config.ensemble_scheduling.step
    ]
    assert steps == [
        ("pre", -1, {"RAW": "raw"}, {"FEATURES": "x"}),
        ("trees", -1, {"input__0": "x"}, {"output__0": "s"}),
        ("post", -1, {"SCORE": "s"}, {"LABEL": "label"}),
    ]
    inputs = [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config.input]
    outputs = [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config.output]
    assert inputs == [("raw", "TYPE_FP32", [FEATURES])]
    assert outputs == [("label", "TYPE_STRING", [1])]
    for name, backend in (("pre", "python"), ("trees", "fil"), ("post", "python")):
        assert _parse(repo / name / "config.pbtxt").backend == backend
    assert [m.name for m in manifest.models] == ["pre", "trees", "post"]
    verify_package(tmp_path / "v")


@pytest.mark.parametrize(
    ("pre_type", "overrides", "expected"),
    [
        (
            "TYPE_FP64",
            {},
            "ensemble.steps.1: model trees input input__0 is TYPE_FP32 [4], but tensor x is "
            "TYPE_FP64 [4]; make the steps agree",
        ),
        (
            "TYPE_FP32",
            {"outputs": ["labels"]},
            "ensemble.outputs: labels is produced by no step",
        ),
        (
            "TYPE_FP32",
            {"max_batch_size": 128},
            "model pre batches up to 32, the ensemble 128; lower the ensemble's max_batch_size",
        ),
        (
            "TYPE_FP32",
            {
                "steps": [
                    {"model": "pre", "input_map": {"RAW": "raw"}, "output_map": {"X": "x"}},
                ]
            },
            "ensemble.steps.0.output_map: model pre has no tensor X; it has FEATURES",
        ),
    ],
)
def test_steps_that_do_not_chain_are_refused(
    tmp_path: Path, pre_type: str, overrides: dict[str, object], expected: str
) -> None:
    with pytest.raises(PackageError) as caught:
        build_package(ensemble_source(tmp_path / "src", pre_type, **overrides), tmp_path / "v")
    assert expected in str(caught.value) and "\n" not in str(caught.value)
