"""Small non-LLM models built at test time (never downloaded), each written into a Triton model
repository (``<model>/config.pbtxt``, ``<model>/1/<file>``) with Triton's real config schema.

An XGBoost classifier and a LightGBM regressor trained on generated data, a scaler exported
from torch to ONNX, a TorchScript module, and ensembles chaining them; each maker returns what
the test compares the server's answers with (the library's own model).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import lightgbm
import numpy as np
import torch
import xgboost
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

__all__ = [
    "FEATURES",
    "Batching",
    "EnsembleStep",
    "ensemble_model",
    "features",
    "lightgbm_model",
    "onnx_scaler",
    "torchscript_model",
    "write_config",
    "xgboost_model",
]

FEATURES = 4
"""Columns of the generated data (every tabular model here reads this many)."""


@dataclass(frozen=True)
class Batching:
    """A config's batching: ``max_batch_size`` and whether ``dynamic_batching`` is set."""

    max_batch_size: int = 64
    dynamic: bool = False
    max_queue_delay_us: int = 0


@dataclass(frozen=True)
class EnsembleStep:
    """One ``ensemble_scheduling.step``: maps are step tensor name -> ensemble tensor name."""

    model: str
    input_map: Mapping[str, str]
    output_map: Mapping[str, str]


def features(rows: int, seed: int = 0, columns: int = FEATURES) -> np.ndarray:
    """Generated FP32 feature rows."""
    return np.random.default_rng(seed).normal(size=(rows, columns)).astype(np.float32)


def _labels(x: np.ndarray) -> np.ndarray:
    """A noisy, non-linear rule, so trees of several depths differ in their predictions."""
    noise = np.random.default_rng(1).normal(scale=0.3, size=len(x))
    return ((x[:, 0] * x[:, 1] + np.sin(x[:, 2]) + noise) > 0).astype(np.float32)


def _tensor(name: str, data_type: int, dims: Sequence[int]) -> mc.ModelInput:
    return mc.ModelInput(name=name, data_type=data_type, dims=list(dims))


def _config(
    name: str,
    inputs: Sequence[mc.ModelInput],
    outputs: Sequence[tuple[str, int, Sequence[int]]],
    batching: Batching,
    **fields: object,
) -> mc.ModelConfig:
    config = mc.ModelConfig(
        name=name,
        max_batch_size=batching.max_batch_size,
        input=list(inputs),
        output=[mc.ModelOutput(name=n, data_type=t, dims=list(d)) for n, t, d in outputs],
        **fields,  # type: ignore[arg-type]
    )
    if batching.dynamic:
        config.dynamic_batching.max_queue_delay_microseconds = batching.max_queue_delay_us
    return config


def write_config(repository: Path, config: mc.ModelConfig) -> Path:
    """Write ``<repository>/<name>/config.pbtxt`` (and make ``1/``); returns the version folder."""
    version = repository / config.name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (repository / config.name / "config.pbtxt").write_text(text_format.MessageToString(config))
    return version


def xgboost_model(
    repository: Path,
    name: str,
    *,
    trees: int = 20,
    depth: int = 3,
    predict_proba: bool = True,
    model_type: str = "xgboost_json",
    batching: Batching = Batching(),
    columns: int = FEATURES,
) -> xgboost.Booster:
    """A binary XGBoost classifier served by the FIL backend (class probabilities, or the
    class when ``predict_proba`` is false)."""
    x = features(1024, seed=2, columns=columns)
    booster = xgboost.train(
        {"objective": "binary:logistic", "max_depth": depth, "nthread": 2},
        xgboost.DMatrix(x, label=_labels(x)),
        num_boost_round=trees,
    )
    config = _config(
        name,
        [_tensor("input__0", mc.TYPE_FP32, [columns])],
        [("output__0", mc.TYPE_FP32, [2 if predict_proba else 1])],
        batching,
        backend="fil",
        instance_group=[mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)],
    )
    for key, value in {
        "model_type": model_type,
        "output_class": "true",
        "predict_proba": str(predict_proba).lower(),
    }.items():
        config.parameters[key].string_value = value
    suffix = {"xgboost_json": "json", "xgboost_ubj": "ubj"}[model_type]
    booster.save_model(write_config(repository, config) / f"xgboost.{suffix}")
    return booster


def lightgbm_model(
    repository: Path, name: str, *, batching: Batching = Batching()
) -> lightgbm.Booster:
    """A LightGBM regressor served by the FIL backend (``is_classifier`` false: raw values)."""
    x = features(1024, seed=3)
    target = x[:, 0] * 2 + np.cos(x[:, 1])
    booster = lightgbm.train(
        {"objective": "regression", "num_leaves": 7, "verbose": -1, "num_threads": 2},
        lightgbm.Dataset(x, label=target),
        num_boost_round=20,
    )
    config = _config(
        name,
        [_tensor("input__0", mc.TYPE_FP32, [FEATURES])],
        [("output__0", mc.TYPE_FP32, [1])],
        batching,
        backend="fil",
    )
    config.parameters["model_type"].string_value = "lightgbm"
    config.parameters["is_classifier"].string_value = "false"
    booster.save_model(str(write_config(repository, config) / "model.txt"))
    return booster


class _Scaler(torch.nn.Module):
    def __init__(self, mean: np.ndarray, scale: np.ndarray) -> None:
        super().__init__()
        self.register_buffer("mean", torch.from_numpy(mean))
        self.register_buffer("scale", torch.from_numpy(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.scale


def onnx_scaler(
    repository: Path, name: str, *, batching: Batching = Batching()
) -> tuple[np.ndarray, np.ndarray]:
    """A standard scaler exported from torch to ONNX (``features`` -> ``scaled``); returns its
    mean and scale."""
    mean = np.linspace(-1, 1, FEATURES).astype(np.float32)
    scale = np.linspace(0.5, 2, FEATURES).astype(np.float32)
    config = _config(
        name,
        [_tensor("features", mc.TYPE_FP32, [FEATURES])],
        [("scaled", mc.TYPE_FP32, [FEATURES])],
        batching,
        backend="onnxruntime",
    )
    with warnings.catch_warnings():
        # The legacy exporter (dynamo=False) warns that it is deprecated; the dynamo one needs
        # onnxscript, which is not installed.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Scaler(mean, scale),
            (torch.zeros(1, FEATURES),),
            str(write_config(repository, config) / "model.onnx"),
            input_names=["features"],
            output_names=["scaled"],
            dynamic_axes={"features": {0: "batch"}, "scaled": {0: "batch"}},
            dynamo=False,
        )
    return mean, scale


class _Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.linear(x) + bias
        return logits, logits.softmax(dim=1)


def torchscript_model(
    repository: Path, name: str, *, indexed_names: bool = True, batching: Batching = Batching()
) -> torch.jit.ScriptModule:
    """A TorchScript module ``forward(x, bias) -> (logits, probabilities)``, its tensors named
    ``INPUT__0``/``INPUT__1`` or after forward's arguments (declared in reverse order then)."""
    with warnings.catch_warnings():
        # torch deprecates TorchScript, but it is the format Triton's pytorch backend loads.
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.script(_Affine().eval())
    if indexed_names:
        inputs = [("INPUT__0", [FEATURES]), ("INPUT__1", [3])]
    else:
        inputs = [("bias", [3]), ("x", [FEATURES])]
    config = _config(
        name,
        [_tensor(n, mc.TYPE_FP32, d) for n, d in inputs],
        [("OUTPUT__1", mc.TYPE_FP32, [3]), ("OUTPUT__0", mc.TYPE_FP32, [3])],
        batching,
        backend="pytorch",
        platform="pytorch_libtorch",
    )
    module.save(str(write_config(repository, config) / "model.pt"))
    return module


def ensemble_model(
    repository: Path,
    name: str,
    steps: Sequence[EnsembleStep],
    inputs: Sequence[tuple[str, Sequence[int]]],
    outputs: Sequence[tuple[str, Sequence[int]]],
    *,
    max_batch_size: int = 64,
) -> None:
    """An ensemble of FP32 tensors chaining models already in the repository."""
    config = _config(
        name,
        [_tensor(n, mc.TYPE_FP32, d) for n, d in inputs],
        [(n, mc.TYPE_FP32, d) for n, d in outputs],
        Batching(max_batch_size),
        platform="ensemble",
    )
    for step in steps:
        config.ensemble_scheduling.step.add(
            model_name=step.model,
            model_version=-1,
            input_map=dict(step.input_map),
            output_map=dict(step.output_map),
        )
    write_config(repository, config)
