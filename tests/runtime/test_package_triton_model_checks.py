"""Model settings that Triton would refuse at load time are refused by the manifest already
(package build, package verify and stage 1): preferred batch sizes above ``max_batch_size``, and
``optional`` on outputs, which Triton's ``ModelOutput`` lacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from runtime.package import PackageError, build_package
from runtime.package.manifest import PythonModel, load_manifest
from runtime.package.triton_models import DynamicBatching, Ensemble, TensorSpec, TritonModel

IN = TensorSpec(name="IN", data_type="TYPE_FP32", dims=[4])
OUT = TensorSpec(name="OUT", data_type="TYPE_FP32", dims=[4])
OPTIONAL_OUT = OUT.model_copy(update={"optional": True})


def _model(**overrides: object) -> TritonModel:
    fields: dict[str, object] = {
        "name": "step",
        "backend": "python",
        "file": "model_repository/step/1/model.py",
        "inputs": [IN],
        "outputs": [OUT],
        "max_batch_size": 8,
        **overrides,
    }
    return TritonModel.model_validate(fields)


@pytest.mark.parametrize("sizes", [[8], [1, 4, 8], []])
def test_preferred_batch_sizes_up_to_max_batch_size_are_accepted(sizes: list[int]) -> None:
    model = _model(dynamic_batching=DynamicBatching(preferred_batch_size=sizes))
    assert model.dynamic_batching is not None
    assert model.dynamic_batching.preferred_batch_size == sizes


@pytest.mark.parametrize(("sizes", "named"), [([64], "64"), ([4, 9, 16], "9, 16")])
def test_preferred_batch_size_above_max_batch_size_is_refused(sizes: list[int], named: str) -> None:
    # Triton core's ValidateModelConfig: "dynamic batching preferred size must be <= max batch
    # size", so such a model would pass the package and fail to load in the pod.
    with pytest.raises(ValidationError) as caught:
        _model(dynamic_batching={"preferred_batch_size": sizes})
    message = caught.value.errors()[0]["msg"]
    assert f"model step: dynamic_batching.preferred_batch_size {named} is above " in message
    assert "max_batch_size 8" in message


@pytest.mark.parametrize("size", [0, -1])
def test_preferred_batch_size_must_be_positive(size: int) -> None:
    with pytest.raises(ValidationError, match="must hold positive sizes"):
        _model(dynamic_batching={"preferred_batch_size": [size]})


def test_optional_output_is_refused_naming_it() -> None:
    with pytest.raises(ValidationError) as caught:
        _model(outputs=[OUT.model_copy(update={"name": "EXTRA"}), OPTIONAL_OUT])
    (error,) = caught.value.errors()
    assert error["loc"] == ("outputs",)
    assert "model step: output OUT is declared optional" in error["msg"]
    assert "remove optional from output OUT" in error["msg"]


def test_optional_input_is_still_allowed() -> None:
    model = _model(
        inputs=[IN, TensorSpec(name="MASK", data_type="TYPE_BOOL", dims=[1], optional=True)]
    )
    assert model.inputs[1].optional


def test_optional_output_refused_for_python_models_and_ensembles() -> None:
    with pytest.raises(ValidationError, match="python_model: output OUT is declared optional"):
        PythonModel(inputs=[IN], outputs=[OPTIONAL_OUT])
    with pytest.raises(ValidationError, match="ensemble: output OUT is declared optional"):
        Ensemble.model_validate(
            {
                "steps": [{"model": "step", "input_map": {"IN": "IN"}, "output_map": {}}],
                "inputs": [IN],
                "outputs": [OPTIONAL_OUT],
                "max_batch_size": 8,
            }
        )


def _ensemble_source(root: Path, model: dict[str, object]) -> Path:
    """A one-step ensemble over a python model (no model file to read, so cheap to build)."""
    (root / "m").mkdir(parents=True)
    (root / "m" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    member = {
        "name": "step",
        "backend": "python",
        "file": "m/model.py",
        "max_batch_size": 8,
        "inputs": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
        "outputs": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
        **model,
    }
    spec = {
        "model_id": "ens",
        "model_version": "v1",
        "backend": "ensemble",
        "ensemble": {
            "max_batch_size": 8,
            "models": [member],
            "steps": [{"model": "step", "input_map": {"IN": "x"}, "output_map": {"OUT": "y"}}],
            "outputs": ["y"],
        },
    }
    (root / "package.yaml").write_text(yaml.safe_dump(spec))
    return root


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (
            {"dynamic_batching": {"preferred_batch_size": [64]}},
            "dynamic_batching.preferred_batch_size 64 is above max_batch_size 8",
        ),
        (
            {"outputs": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4], "optional": True}]},
            "output OUT is declared optional",
        ),
    ],
)
def test_package_build_refuses_what_triton_would(
    tmp_path: Path, model: dict[str, object], expected: str
) -> None:
    source = _ensemble_source(tmp_path / "src", model)
    with pytest.raises(PackageError, match=expected) as caught:
        build_package(source, tmp_path / "v")
    # One line naming the model and the field, not pydantic's report.
    assert "\n" not in str(caught.value) and str(caught.value).startswith("ensemble.models.0: ")
    assert not (tmp_path / "v" / "manifest.json").exists()


@pytest.mark.parametrize(
    ("edit", "field", "expected"),
    [
        (
            lambda m: m.update(dynamic_batching={"preferred_batch_size": [64]}),
            "field models.0: ",
            "preferred_batch_size 64 is above max_batch_size 8",
        ),
        (
            lambda m: m["outputs"][0].update(optional=True),
            "field models.0.outputs: ",
            "model step: output OUT is declared optional",
        ),
    ],
)
def test_manifest_refuses_what_triton_would(
    tmp_path: Path, edit: object, field: str, expected: str
) -> None:
    """A manifest written by another build (or by hand) is refused by verify and stage 1, which
    both read it with `load_manifest`, in one line naming the field."""
    build_package(_ensemble_source(tmp_path / "src", {}), tmp_path / "v")
    path = tmp_path / "v" / "manifest.json"
    data = json.loads(path.read_text())
    assert callable(edit)
    edit(data["models"][0])
    path.write_text(json.dumps(data))
    with pytest.raises(PackageError) as caught:
        load_manifest(path)
    message = str(caught.value)
    assert "\n" not in message
    assert field in message and expected in message
