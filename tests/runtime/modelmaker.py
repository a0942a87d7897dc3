"""Small real models built at test time (never downloaded): XGBoost and LightGBM trees trained on
generated data, an ONNX graph, a TorchScript module, and package source trees holding them."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import yaml

__all__ = [
    "FEATURES",
    "ensemble_source",
    "lightgbm_regressor",
    "model_source",
    "onnx_linear",
    "torchscript_linear",
    "training_data",
    "xgboost_classifier",
]

#: Feature count of the generated tabular data.
FEATURES = 4


def training_data(rows: int = 200, classes: int = 2, seed: int = 0) -> tuple[Any, Any]:
    """Features and labels whose class follows the first two features (learnable in few trees)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    score = x[:, 0] + 0.5 * x[:, 1]
    edges = np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1])
    return x, np.digitize(score, edges)


def xgboost_classifier(path: Path, classes: int = 2, trees: int = 5) -> Path:
    """An XGBoost classifier saved in the format ``path``'s suffix names (.json, .ubj)."""
    import xgboost

    x, y = training_data(classes=classes)
    # xgboost.train, not XGBClassifier: the scikit-learn API needs scikit-learn installed.
    objective = (
        {"objective": "binary:logistic"}
        if classes == 2
        else {
            "objective": "multi:softprob",
            "num_class": classes,
        }
    )
    params = {**objective, "max_depth": 3, "nthread": 1}
    booster = xgboost.train(params, xgboost.DMatrix(x, label=y), num_boost_round=trees)
    path.parent.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(path))
    return path


def lightgbm_regressor(path: Path, trees: int = 5) -> Path:
    """A LightGBM regressor saved as LightGBM's text model."""
    import lightgbm

    x, y = training_data()
    data = lightgbm.Dataset(x, label=y.astype(np.float32))
    params = {"objective": "regression", "num_leaves": 4, "verbose": -1, "num_threads": 1}
    booster = lightgbm.train(params, data, num_boost_round=trees)
    path.parent.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(path))
    return path


def onnx_linear(path: Path, batch: str | int = "batch", outputs: int = 3) -> Path:
    """``probs = softmax(features @ W)``: FP32 [batch, 4] -> FP32 [batch, ``outputs``] (a
    symbolic ``batch`` dimension unless ``batch`` is a number), plus an INT64 argmax."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.arange(FEATURES * outputs, dtype=np.float32).reshape(FEATURES, outputs) / 10
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["features", "W"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
            helper.make_node("ArgMax", ["logits"], ["label"], axis=-1, keepdims=1),
        ],
        "linear",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [batch, FEATURES])],
        [
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, outputs]),
            helper.make_tensor_value_info("label", TensorProto.INT64, [batch, 1]),
        ],
        initializer=[numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def torchscript_linear(path: Path, outputs: int = 2) -> Path:
    """A scripted ``Linear(4, outputs)`` whose ``forward(features)`` returns FP32 scores."""
    import torch

    class Linear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(FEATURES, outputs)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return self.layer(features)

    torch.manual_seed(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Triton still serves TorchScript
        torch.jit.save(torch.jit.script(Linear()), str(path))
    return path


def model_source(root: Path, **spec: object) -> Path:
    """A source tree whose ``package.yaml`` is model ``tab``/``v1`` with ``spec`` over it (the
    model files are written by the caller)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "package.yaml").write_text(
        yaml.safe_dump({"model_id": "tab", "model_version": "v1", **spec})
    )
    return root


_PYTHON = "class TritonPythonModel:\n    pass\n"


def _python_step(root: Path, name: str, inputs: list[dict], outputs: list[dict]) -> dict:
    (root / name).mkdir(parents=True)
    (root / name / "model.py").write_text(_PYTHON)
    (root / name / "helpers.py").write_text("X = 1\n")
    return {
        "name": name,
        "backend": "python",
        "file": f"{name}/model.py",
        "max_batch_size": 32,
        "inputs": inputs,
        "outputs": outputs,
    }


def ensemble_source(root: Path, pre_output_type: str = "TYPE_FP32", **overrides: object) -> Path:
    """An ensemble package source: a python pre-processing step, an XGBoost classifier for FIL and
    a python post-processing step (``overrides`` go over the ensemble's keys)."""
    xgboost_classifier(root / "trees" / "clf.json")
    raw = {"name": "RAW", "data_type": "TYPE_FP32", "dims": [FEATURES]}
    pre = _python_step(
        root,
        "pre",
        [raw],
        [{"name": "FEATURES", "data_type": pre_output_type, "dims": [FEATURES]}],
    )
    post = _python_step(
        root,
        "post",
        [{"name": "SCORE", "data_type": "TYPE_FP32", "dims": [1]}],
        [{"name": "LABEL", "data_type": "TYPE_STRING", "dims": [1]}],
    )
    trees = {"name": "trees", "backend": "fil", "file": "trees/clf.json", "max_batch_size": 64}
    ensemble = {
        "models": [pre, trees, post],
        "steps": [
            {"model": "pre", "input_map": {"RAW": "raw"}, "output_map": {"FEATURES": "x"}},
            {"model": "trees", "input_map": {"input__0": "x"}, "output_map": {"output__0": "s"}},
            {"model": "post", "input_map": {"SCORE": "s"}, "output_map": {"LABEL": "label"}},
        ],
        "outputs": ["label"],
        "max_batch_size": 32,
        **overrides,
    }
    return model_source(root, backend="ensemble", ensemble=ensemble)
