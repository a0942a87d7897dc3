"""Read a model file's tensors with the library that wrote it: ONNX graphs (``onnx``), XGBoost
and LightGBM tree models (as Triton's FIL backend sees them) and TorchScript modules (``torch``).

The libraries are imported only here and only when needed: they come with the ``models`` extra.
"""

from __future__ import annotations

import importlib
import json
import re
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

from runtime.package.errors import PackageError
from runtime.package.triton_models import (
    FilModelType,
    FilParameters,
    ModelBackend,
    TensorSpec,
    TensorType,
)

__all__ = [
    "FIL_FILE_NAMES",
    "MODEL_FILE_NAMES",
    "check_torchscript",
    "fil_model_type",
    "model_file_name",
    "read_fil",
    "read_onnx",
]

#: The file name Triton's FIL backend loads for each ``model_type`` (its docs' "Model Filenames").
FIL_FILE_NAMES: dict[FilModelType, str] = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
}
#: The default model file names of the other backends (``default_model_filename`` unset).
MODEL_FILE_NAMES: dict[str, str] = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "python": "model.py",
}
_FIL_SUFFIXES: dict[str, FilModelType] = {
    ".json": "xgboost_json",
    ".ubj": "xgboost_ubj",
    ".model": "xgboost",
    ".bin": "xgboost",
    ".txt": "lightgbm",
}
_SKLEARN_SUFFIXES = (".pkl", ".pickle", ".joblib", ".tl")
_ONNX_TYPES: dict[str, TensorType] = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FLOAT16": "TYPE_FP16",
    "FLOAT": "TYPE_FP32",
    "DOUBLE": "TYPE_FP64",
    "BFLOAT16": "TYPE_BF16",
    "STRING": "TYPE_STRING",
}
# What Triton's PyTorch backend converts (libtorch_utils.cc): no BF16, no unsigned wider than 8.
_TORCH_TYPES: dict[str, str] = {
    "TYPE_BOOL": "bool",
    "TYPE_UINT8": "uint8",
    "TYPE_INT8": "int8",
    "TYPE_INT16": "int16",
    "TYPE_INT32": "int32",
    "TYPE_INT64": "int64",
    "TYPE_FP16": "float16",
    "TYPE_FP32": "float32",
    "TYPE_FP64": "float64",
}
_INDEXED_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*__(\d+)$")


def _library(name: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise PackageError(
            f"reading {what} needs the {name} package: pip install 'llm-serving[models]'"
        ) from exc


def model_file_name(backend: ModelBackend, fil: FilParameters | None) -> str:
    """The file name the model gets in its version folder: the one its backend loads."""
    if fil is not None:
        return FIL_FILE_NAMES[fil.model_type]
    return MODEL_FILE_NAMES[backend]


def fil_model_type(path: Path, given: FilModelType | None) -> FilModelType:
    """The FIL ``model_type`` of a tree model file: ``given``, else from its suffix."""
    if given is not None:
        return given
    suffix = path.suffix.lower()
    if suffix in _SKLEARN_SUFFIXES:
        # FIL takes scikit-learn forests only as Treelite checkpoints, which need treelite
        # (not a dependency here) to read back; XGBoost's own file formats need nothing more.
        raise PackageError(
            f"{path.name}: scikit-learn models (pickles, Treelite checkpoints) are not packaged; "
            "retrain with XGBoost's or LightGBM's scikit-learn API (xgboost.XGBClassifier, "
            "lightgbm.LGBMClassifier) and save it with model.save_model('xgboost.json') or "
            "model.booster_.save_model('model.txt')"
        )
    found = _FIL_SUFFIXES.get(suffix)
    if found is None:
        raise PackageError(
            f"{path.name}: unknown tree model type; save it as .json/.ubj (XGBoost) or .txt "
            "(LightGBM), or set fil.model_type to one of "
            f"{', '.join(FIL_FILE_NAMES)}"
        )
    return found


def read_fil(
    path: Path, model_type: FilModelType, predict_proba: bool, threshold: float
) -> tuple[list[TensorSpec], list[TensorSpec], FilParameters]:
    """The FIL backend's tensors for a tree model (``input__0`` FP32 [features], ``output__0``
    FP32 [1], or [classes] with ``predict_proba``) and its parameters, read from ``path``."""
    if model_type == "lightgbm":
        features, classes, classifier = _read_lightgbm(path)
    else:
        features, classes, classifier = _read_xgboost(path, model_type)
    if predict_proba and not classifier:
        raise PackageError(
            f"{path.name} is a regression model: remove fil.predict_proba (it returns class "
            "probabilities)"
        )
    # FIL returns [1 - p, p] for a binary classifier whose output is declared two wide.
    width = max(classes, 2) if predict_proba else 1
    fil = FilParameters(
        model_type=model_type,
        is_classifier=classifier,
        predict_proba=predict_proba,
        threshold=threshold,
    )
    inputs = [TensorSpec(name="input__0", data_type="TYPE_FP32", dims=[features])]
    outputs = [TensorSpec(name="output__0", data_type="TYPE_FP32", dims=[width])]
    return inputs, outputs, fil


def _read_xgboost(path: Path, model_type: FilModelType) -> tuple[int, int, bool]:
    xgboost = _library("xgboost", f"{path.name} (XGBoost)")
    try:
        booster = xgboost.Booster(model_file=str(path))
        config = json.loads(booster.save_config())
        objective = str(config["learner"]["objective"]["name"])
        classes = int(config["learner"]["learner_model_param"]["num_class"])
        features = int(booster.num_features())
    except Exception as exc:  # xgboost raises XGBoostError and plain errors for bad files
        raise PackageError(
            f"{path.name} does not load as an XGBoost model ({model_type}): {_first_line(exc)}; "
            "save it with Booster.save_model('xgboost.json'), or set fil.model_type to what it is"
        ) from exc
    return features, classes, objective.startswith(("binary:", "multi:"))


def _read_lightgbm(path: Path) -> tuple[int, int, bool]:
    lightgbm = _library("lightgbm", f"{path.name} (LightGBM)")
    try:
        booster = lightgbm.Booster(model_file=str(path))
        dumped = booster.dump_model(num_iteration=1)
        objective = str(dumped.get("objective", ""))
        classes = int(dumped["num_class"])
        features = int(booster.num_feature())
    except Exception as exc:  # lightgbm raises LightGBMError and plain errors for bad files
        raise PackageError(
            f"{path.name} does not load as a LightGBM text model: {_first_line(exc)}; save it "
            "with booster.save_model('model.txt'), or set fil.model_type to what it is"
        ) from exc
    return features, classes, objective.startswith(("binary", "multiclass"))


def read_onnx(path: Path, max_batch_size: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The graph's inputs and outputs in Triton's terms: symbolic dims are -1, and with
    ``max_batch_size`` above 0 the first (batch) dimension is dropped."""
    onnx = _library("onnx", f"{path.name} (ONNX)")
    try:
        # The tensors are in the graph; external weight files need not be read for them.
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # onnx raises DecodeError, ValueError, OSError for bad files
        raise PackageError(
            f"{path.name} does not load as an ONNX model: {_first_line(exc)}; export it with "
            "torch.onnx.export or onnx.save"
        ) from exc
    initializers = {init.name for init in graph.initializer}
    inputs = [v for v in graph.input if v.name not in initializers]
    return (
        [_onnx_tensor(onnx, path, v, max_batch_size) for v in inputs],
        [_onnx_tensor(onnx, path, v, max_batch_size) for v in graph.output],
    )


def _onnx_tensor(onnx: ModuleType, path: Path, value: Any, max_batch_size: int) -> TensorSpec:
    if value.type.WhichOneof("value") != "tensor_type":
        raise PackageError(
            f"{path.name}: graph tensor {value.name} is not a tensor (sequence or map), which "
            "Triton's ONNX Runtime backend cannot serve; export plain tensors"
        )
    tensor = value.type.tensor_type
    elem = onnx.TensorProto.DataType.Name(tensor.elem_type)
    data_type = _ONNX_TYPES.get(elem)
    if data_type is None:
        raise PackageError(
            f"{path.name}: graph tensor {value.name} has element type {elem}, which Triton has "
            "no type for; cast it in the graph (e.g. to FLOAT)"
        )
    dims = [
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tensor.shape.dim
    ]
    if max_batch_size > 0:
        if not dims or dims[0] != -1:
            raise PackageError(
                f"{path.name}: graph tensor {value.name} has shape {dims}, without a variable "
                "first (batch) dimension; export it with a dynamic batch axis (dynamic_axes) "
                "or set max_batch_size: 0"
            )
        dims = dims[1:]
    if not dims:
        raise PackageError(
            f"{path.name}: graph tensor {value.name} is a scalar per request; give it a "
            "dimension of 1 in the graph"
        )
    return TensorSpec(name=_triton_name(path, value.name), data_type=data_type, dims=dims)


def _triton_name(path: Path, name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise PackageError(
            f"{path.name}: graph tensor name {name!r} is not a plain identifier; rename it "
            "when exporting (input_names=, output_names=)"
        )
    return name


def check_torchscript(
    path: Path, inputs: list[TensorSpec], outputs: list[TensorSpec], max_batch_size: int
) -> None:
    """Check declared tensors against a TorchScript module: the inputs against ``forward``'s
    arguments (TorchScript keeps names, not dtypes or shapes), the outputs against one run on
    zeros of the declared inputs."""
    torch = _library("torch", f"{path.name} (TorchScript)")
    try:
        # TorchScript is what Triton's PyTorch backend loads, however torch now labels it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(path), map_location="cpu")
        arguments = [a.name for a in module.forward.schema.arguments[1:]]  # [0] is self
    except Exception as exc:  # torch raises RuntimeError and plain errors for bad files
        raise PackageError(
            f"{path.name} does not load as a TorchScript module: {_first_line(exc)}; save it "
            "with torch.jit.save(torch.jit.script(model), 'model.pt')"
        ) from exc
    for tensor in (*inputs, *outputs):
        if tensor.data_type not in _TORCH_TYPES:
            raise PackageError(
                f"{path.name}: tensor {tensor.name} is {tensor.data_type}, which Triton's "
                f"PyTorch backend does not take; use one of {', '.join(_TORCH_TYPES)}"
            )
    if len(inputs) != len(arguments):
        raise PackageError(
            f"{path.name}: forward takes {len(arguments)} tensors ({', '.join(arguments)}), "
            f"{len(inputs)} inputs are declared; declare one input per argument"
        )
    order = _input_order(path, [t.name for t in inputs], arguments)
    _check_output_names(path, outputs)
    batch = [1] if max_batch_size > 0 else []
    zeros = [
        torch.zeros([*batch, *(1 if d == -1 else d for d in t.dims)], dtype=_dtype(torch, t))
        for t in sorted(inputs, key=lambda t: order[t.name])
    ]
    try:
        with torch.no_grad():
            result = module(*zeros)
    except Exception as exc:  # whatever the module's own code raises
        raise PackageError(
            f"{path.name}: running forward once on zeros of the declared inputs failed: "
            f"{_first_line(exc)}; fix the inputs' data_type and dims"
        ) from exc
    produced = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(produced) != len(outputs):
        raise PackageError(
            f"{path.name}: forward returns {len(produced)} tensors, {len(outputs)} outputs are "
            "declared; declare one output per returned tensor (OUTPUT__0, OUTPUT__1, ...)"
        )
    by_index = sorted(outputs, key=lambda t: int(_INDEXED_NAME.fullmatch(t.name).group(1)))  # type: ignore[union-attr]
    for spec, value in zip(by_index, produced, strict=True):
        _check_output(torch, path, spec, value, len(batch))


def _input_order(path: Path, names: list[str], arguments: list[str]) -> dict[str, int]:
    """Each input's position in ``forward``, by argument name or by ``<name>__<index>``."""
    if set(names) == set(arguments):
        return {name: arguments.index(name) for name in names}
    indexes = [_INDEXED_NAME.fullmatch(name) for name in names]
    if all(indexes) and sorted(int(m.group(1)) for m in indexes if m) == list(range(len(names))):
        return {m.string: int(m.group(1)) for m in indexes if m}
    raise PackageError(
        f"{path.name}: inputs {', '.join(names)} match neither forward's arguments "
        f"({', '.join(arguments)}) nor the <name>__<index> convention; name them after the "
        "arguments or INPUT__0, INPUT__1, ..."
    )


def _check_output_names(path: Path, outputs: list[TensorSpec]) -> None:
    indexes = [_INDEXED_NAME.fullmatch(t.name) for t in outputs]
    if not all(indexes) or sorted(int(m.group(1)) for m in indexes if m) != list(
        range(len(outputs))
    ):
        raise PackageError(
            f"{path.name}: outputs {', '.join(t.name for t in outputs)} must follow Triton's "
            "PyTorch convention <name>__<index> for the returned tensors: OUTPUT__0, OUTPUT__1, ..."
        )


def _dtype(torch: ModuleType, tensor: TensorSpec) -> Any:
    return getattr(torch, _TORCH_TYPES[tensor.data_type])


def _check_output(torch: ModuleType, path: Path, spec: TensorSpec, value: Any, batch: int) -> None:
    if not isinstance(value, torch.Tensor):
        raise PackageError(
            f"{path.name}: forward returns a {type(value).__name__} for {spec.name}, not a "
            "tensor; return tensors only"
        )
    shape = list(value.shape)[batch:]
    found = next((t for t, n in _TORCH_TYPES.items() if getattr(torch, n) == value.dtype), None)
    if found != spec.data_type:
        raise PackageError(
            f"{path.name}: output {spec.name} is {value.dtype} when run, declared "
            f"{spec.data_type}; declare data_type {found or 'a supported type'}"
        )
    if len(shape) != len(spec.dims) or any(
        d not in (-1, n) for d, n in zip(spec.dims, shape, strict=False)
    ):
        raise PackageError(
            f"{path.name}: output {spec.name} has shape {shape} (without the batch dimension) "
            f"when run, declared dims {spec.dims}; declare dims {shape}, with -1 where it varies"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
