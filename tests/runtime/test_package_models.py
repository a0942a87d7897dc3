"""Tree, ONNX and TorchScript packages: tensors read from real model files at build time,
checked again by verify, and the Triton model repository that build writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from runtime.package import MANIFEST_NAME, PackageError, build_package, verify_package
from runtime.package.build import file_entry
from tests.runtime.modelmaker import (
    FEATURES,
    lightgbm_regressor,
    model_source,
    onnx_linear,
    torchscript_linear,
    xgboost_classifier,
)


def _config(version: Path, name: str = "tab") -> mc.ModelConfig:
    """A written ``config.pbtxt`` as Triton parses it (an unknown field raises)."""
    text = (version / "model_repository" / name / "config.pbtxt").read_text()
    return text_format.Parse(text, mc.ModelConfig())


def _tensors(config: mc.ModelConfig) -> list[tuple[str, str, list[int]]]:
    return [
        (t.name, mc.DataType.Name(t.data_type), list(t.dims))
        for t in (*config.input, *config.output)
    ]


def _params(config: mc.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def test_xgboost_classifier_package(tmp_path: Path) -> None:
    xgboost_classifier(tmp_path / "src" / "trees" / "clf.json")
    model = {
        "file": "trees/clf.json",
        "max_batch_size": 1024,
        "dynamic_batching": {"max_queue_delay_microseconds": 200, "preferred_batch_size": [64]},
    }
    source = model_source(tmp_path / "src", backend="fil", model=model)
    manifest = build_package(source, tmp_path / "v")
    (tab,) = manifest.models
    assert manifest.tokenizer is None and manifest.weights == "model_repository"
    assert tab.file == "model_repository/tab/1/xgboost.json"
    assert tab.fil is not None and tab.fil.model_type == "xgboost_json" and tab.fil.is_classifier
    assert {e.path for e in manifest.weight_files} == {
        "model_repository/tab/config.pbtxt",
        "model_repository/tab/1/xgboost.json",
    }
    config = _config(tmp_path / "v")
    assert config.backend == "fil" and config.max_batch_size == 1024
    assert config.default_model_filename == "xgboost.json"
    assert _tensors(config) == [
        ("input__0", "TYPE_FP32", [FEATURES]),
        ("output__0", "TYPE_FP32", [1]),
    ]
    assert _params(config) == {
        "model_type": "xgboost_json",
        "is_classifier": "true",
        "predict_proba": "false",
        "threshold": "0.5",
    }
    assert config.dynamic_batching.max_queue_delay_microseconds == 200
    assert list(config.dynamic_batching.preferred_batch_size) == [64]
    (group,) = config.instance_group
    assert mc.ModelInstanceGroup.Kind.Name(group.kind) == "KIND_CPU" and group.count == 1
    assert verify_package(tmp_path / "v") == manifest


@pytest.mark.parametrize(("classes", "width"), [(3, 3), (2, 2)])
def test_class_probabilities_are_as_wide_as_the_classes(
    tmp_path: Path, classes: int, width: int
) -> None:
    xgboost_classifier(tmp_path / "src" / "clf.ubj", classes=classes)
    model = {
        "file": "clf.ubj",
        "max_batch_size": 8,
        "instance_group": {"kind": "KIND_GPU", "count": 2},
        "fil": {"predict_proba": True, "threshold": 0.3},
    }
    source = model_source(tmp_path / "src", backend="fil", model=model)
    build_package(source, tmp_path / "v")
    config = _config(tmp_path / "v")
    assert _tensors(config)[1] == ("output__0", "TYPE_FP32", [width])
    assert _params(config)["model_type"] == "xgboost_ubj"
    assert _params(config)["predict_proba"] == "true" and _params(config)["threshold"] == "0.3"
    assert (tmp_path / "v" / "model_repository" / "tab" / "1" / "xgboost.ubj").is_file()
    (group,) = config.instance_group
    assert mc.ModelInstanceGroup.Kind.Name(group.kind) == "KIND_GPU" and group.count == 2


def test_lightgbm_regressor_package(tmp_path: Path) -> None:
    lightgbm_regressor(tmp_path / "src" / "reg.txt")
    model = {"file": "reg.txt", "max_batch_size": 16}
    build_package(model_source(tmp_path / "src", backend="fil", model=model), tmp_path / "v")
    config = _config(tmp_path / "v")
    assert config.default_model_filename == "model.txt"
    assert _params(config)["model_type"] == "lightgbm"
    assert _params(config)["is_classifier"] == "false"
    assert _tensors(config)[0] == ("input__0", "TYPE_FP32", [FEATURES])
    verify_package(tmp_path / "v")

    proba = {**model, "fil": {"predict_proba": True}}
    source = model_source(tmp_path / "src", backend="fil", model=proba)
    with pytest.raises(PackageError, match=r"reg.txt is a regression model: remove fil"):
        build_package(source, tmp_path / "w")


def test_onnx_tensors_come_from_the_graph(tmp_path: Path) -> None:
    onnx_linear(tmp_path / "src" / "linear.onnx")
    model = {"file": "linear.onnx", "max_batch_size": 8, "dynamic_batching": {}}
    source = model_source(tmp_path / "src", backend="onnxruntime", model=model)
    manifest = build_package(source, tmp_path / "v")
    config = _config(tmp_path / "v")
    assert config.backend == "onnxruntime" and config.default_model_filename == "model.onnx"
    assert config.HasField("dynamic_batching")
    assert _tensors(config) == [
        ("features", "TYPE_FP32", [FEATURES]),
        ("probs", "TYPE_FP32", [3]),
        ("label", "TYPE_INT64", [1]),
    ]
    assert manifest.models[0].file == "model_repository/tab/1/model.onnx"
    verify_package(tmp_path / "v", full=False)

    # Without batching the symbolic batch dimension stays, as -1.
    source = model_source(tmp_path / "src", backend="onnxruntime", model={"file": "linear.onnx"})
    build_package(source, tmp_path / "w")
    assert _tensors(_config(tmp_path / "w"))[0] == ("features", "TYPE_FP32", [-1, FEATURES])


def test_a_fixed_batch_dimension_cannot_batch(tmp_path: Path) -> None:
    onnx_linear(tmp_path / "src" / "fixed.onnx", batch=1)
    model = {"file": "fixed.onnx", "max_batch_size": 8}
    source = model_source(tmp_path / "src", backend="onnxruntime", model=model)
    with pytest.raises(PackageError) as caught:
        build_package(source, tmp_path / "v")
    message = str(caught.value)
    assert "fixed.onnx: graph tensor features has shape [1, 4]" in message
    assert "dynamic batch axis" in message and "max_batch_size: 0" in message
    assert "\n" not in message and not (tmp_path / "v").exists()


def _torch_model(**overrides: object) -> dict[str, object]:
    return {
        "file": "scripted.pt",
        "max_batch_size": 4,
        "inputs": [{"name": "features", "data_type": "TYPE_FP32", "dims": [FEATURES]}],
        "outputs": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [2]}],
        **overrides,
    }


def test_torchscript_package_checked_by_running_it(tmp_path: Path) -> None:
    torchscript_linear(tmp_path / "src" / "scripted.pt")
    source = model_source(tmp_path / "src", backend="pytorch", model=_torch_model())
    build_package(source, tmp_path / "v")
    config = _config(tmp_path / "v")
    assert config.backend == "pytorch" and config.default_model_filename == "model.pt"
    assert _tensors(config) == [
        ("features", "TYPE_FP32", [FEATURES]),
        ("OUTPUT__0", "TYPE_FP32", [2]),
    ]
    assert (tmp_path / "v" / "model_repository" / "tab" / "1" / "model.pt").is_file()
    verify_package(tmp_path / "v")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"outputs": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [3]}]},
            "output OUTPUT__0 has shape [2] (without the batch dimension) when run, declared "
            "dims [3]; declare dims [2]",
        ),
        (
            {"outputs": [{"name": "OUTPUT__0", "data_type": "TYPE_INT64", "dims": [2]}]},
            "output OUTPUT__0 is torch.float32 when run, declared TYPE_INT64; declare "
            "data_type TYPE_FP32",
        ),
        (
            {"inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [FEATURES]}]},
            "inputs x match neither forward's arguments (features)",
        ),
        (
            {"outputs": [{"name": "scores", "data_type": "TYPE_FP32", "dims": [2]}]},
            "must follow Triton's PyTorch convention <name>__<index>",
        ),
        (
            {"inputs": [{"name": "features", "data_type": "TYPE_FP32", "dims": [5]}]},
            "running forward once on zeros of the declared inputs failed",
        ),
        ({"inputs": None}, "backend pytorch needs inputs and outputs declared"),
    ],
)
def test_torchscript_mismatch_is_one_line(
    tmp_path: Path, overrides: dict[str, object], expected: str
) -> None:
    torchscript_linear(tmp_path / "src" / "scripted.pt")
    model = {k: v for k, v in _torch_model(**overrides).items() if v is not None}
    source = model_source(tmp_path / "src", backend="pytorch", model=model)
    with pytest.raises(PackageError) as caught:
        build_package(source, tmp_path / "v")
    assert expected in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "content", "backend", "expected"),
    [
        ("model.pkl", b"\x80\x04", "fil", "scikit-learn models (pickles, Treelite checkpoints)"),
        ("model.bst", b"x", "fil", "model.bst: unknown tree model type; save it as .json/.ubj"),
        ("broken.json", b"{not json", "fil", "broken.json does not load as an XGBoost model"),
        ("broken.onnx", b"\x01\x02garbage", "onnxruntime", "broken.onnx does not load as an ONNX"),
    ],
)
def test_unloadable_or_unknown_model_files(
    tmp_path: Path, name: str, content: bytes, backend: str, expected: str
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / name).write_bytes(content)
    model = {"file": name, "max_batch_size": 4}
    with pytest.raises(PackageError) as caught:
        build_package(model_source(tmp_path / "src", backend=backend, model=model), tmp_path / "v")
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_verify_reads_the_model_file_again(tmp_path: Path) -> None:
    onnx_linear(tmp_path / "src" / "linear.onnx")
    model = {"file": "linear.onnx", "max_batch_size": 8}
    build_package(
        model_source(tmp_path / "src", backend="onnxruntime", model=model), tmp_path / "v"
    )
    # Another graph under the same name, sealed into the manifest so only the tensors differ.
    replaced = tmp_path / "v" / "model_repository" / "tab" / "1" / "model.onnx"
    replaced.unlink()
    onnx_linear(replaced, outputs=5)
    data = json.loads((tmp_path / "v" / MANIFEST_NAME).read_text())
    data["weight_files"] = [
        file_entry(replaced, e["path"]).model_dump() if e["path"].endswith(".onnx") else e
        for e in data["weight_files"]
    ]
    (tmp_path / "v" / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(PackageError) as caught:
        verify_package(tmp_path / "v")
    assert str(caught.value) == (
        "model_repository/tab/1/model.onnx: the file's outputs are probs TYPE_FP32 [5], "
        "label TYPE_INT64 [1], not the manifest's; rebuild the package from this model file"
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"tokenizer": "tok"}, "tokenizer: backend fil has no tokenizer, weights folder"),
        ({"serving_mode": "embedded"}, "serving_mode: embedded puts the OpenAI frontend"),
        ({"model": None}, "backend fil takes model (file, max_batch_size, ...)"),
        ({"model": {"file": "clf.json"}}, "backend fil batches rows: set max_batch_size"),
    ],
)
def test_llm_settings_refused_for_tree_models(
    tmp_path: Path, spec: dict[str, object], expected: str
) -> None:
    xgboost_classifier(tmp_path / "src" / "clf.json")
    full = {"backend": "fil", "model": {"file": "clf.json", "max_batch_size": 8}, **spec}
    source = model_source(tmp_path / "src", **{k: v for k, v in full.items() if v is not None})
    with pytest.raises(PackageError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        build_package(source, tmp_path / "v")
