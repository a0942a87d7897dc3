"""A stand-in for Triton's FIL, onnxruntime and pytorch backends and its ensemble scheduler: the
models of a Triton model repository, executed by their own libraries for the KServe stand-in.

The ``tritonserver`` 2.51 installed here from PyPI has only the Python backend, so
:mod:`tests.support.kserve_server` serves these models through this module. It reads
``<model>/config.pbtxt`` into Triton's own schema (``model_config_pb2.ModelConfig``) and
``<model>/<version>/<file>``, and executes ``backend: "fil"`` (XGBoost and LightGBM files, as
the FIL backend's ``model_type``, ``is_classifier`` (``output_class`` before 25.09),
``predict_proba`` and ``threshold`` parameters say) with the ``xgboost`` and ``lightgbm``
packages, ``onnxruntime`` with onnxruntime, ``pytorch`` (TorchScript) with torch on CPU, and
``platform: "ensemble"`` by chaining its steps, every model scheduled by
:mod:`tests.support.dynamic_batcher`. Requests are checked as Triton's core checks them (input
names, datatypes, shapes, batch size) and refused with its messages. Configs are taken as
written (no auto-complete from the model file). It never runs in product code.
"""

from __future__ import annotations

import asyncio
import math
import re
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import (
    deserialize_bytes_tensor,
    np_to_triton_dtype,
    serialize_byte_tensor,
    triton_to_np_dtype,
)

from tests.support.dynamic_batcher import Execute, Scheduler, Tensors

__all__ = [
    "BackendFailure",
    "InvalidInput",
    "ModelLoadError",
    "ModelRepository",
    "RepositoryModel",
]

# The FIL backend's model_type values and the file each reads by default.
FIL_MODEL_FILES = {
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "xgboost": "xgboost.model",
    "lightgbm": "model.txt",
}
_DEFAULT_FILES = {"onnxruntime": "model.onnx", "pytorch": "model.pt"}
_PLATFORM_BACKENDS = {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch"}
# Triton's pytorch backend maps "<name>__<index>" tensors to forward's positions.
_INDEXED_NAME = re.compile(r".+__(\d+)$")
# ModelInferRequest.contents fields, for a client that sends typed contents instead of raw bytes.
_CONTENTS_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class InvalidInput(Exception):
    """A request Triton's core refuses with INVALID_ARGUMENT."""


class BackendFailure(Exception):
    """An error raised by the backend's library while executing; Triton answers INTERNAL."""


class ModelLoadError(ValueError):
    """A model that does not load; the message names the model and what is wrong."""


def wire_type(data_type: int) -> str:
    """KServe's datatype for a config ``DataType``: ``TYPE_FP32`` -> ``FP32``, strings ``BYTES``."""
    name = model_config_pb2.DataType.Name(data_type).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def read_config(model_dir: Path) -> model_config_pb2.ModelConfig:
    """``config.pbtxt`` parsed into Triton's schema; an unknown field fails as in Triton."""
    path = model_dir / "config.pbtxt"
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except (OSError, text_format.ParseError) as exc:
        raise ModelLoadError(f"failed to load '{model_dir.name}': {path}: {exc}") from exc
    if not config.name:
        config.name = model_dir.name  # Triton names a model after its folder
    return config


def _dims(values: Sequence[int]) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


@dataclass
class RepositoryModel:
    """One loaded model: its config, the version served and how a batch of inputs runs."""

    config: model_config_pb2.ModelConfig
    version: str
    run: Callable[[Tensors], Awaitable[Tensors]]
    scheduler: Scheduler | None = None
    """None for an ensemble: its steps are scheduled by their own models."""

    @property
    def name(self) -> str:
        return self.config.name

    def _full_dims(self, dims: Sequence[int]) -> list[int]:
        return [-1, *dims] if self.config.max_batch_size > 0 else list(dims)

    def metadata(self) -> service_pb2.ModelMetadataResponse:
        """Triton's metadata answer: tensors with the batch dimension (-1) when batching."""
        meta = service_pb2.ModelMetadataResponse
        return meta(
            name=self.name,
            versions=[self.version],
            platform=self.config.platform or self.config.backend,
            inputs=[
                meta.TensorMetadata(
                    name=t.name, datatype=wire_type(t.data_type), shape=self._full_dims(t.dims)
                )
                for t in self.config.input
            ],
            outputs=[
                meta.TensorMetadata(
                    name=t.name, datatype=wire_type(t.data_type), shape=self._full_dims(t.dims)
                )
                for t in self.config.output
            ],
        )

    def check_inputs(self, inputs: Tensors) -> None:
        """Refuse what Triton's core refuses before a backend sees the request."""
        declared = {t.name: t for t in self.config.input}
        for name in inputs:
            if name not in declared:
                raise InvalidInput(f"unexpected inference input '{name}' for model '{self.name}'")
        required = [t.name for t in self.config.input if not t.optional]
        missing = [name for name in required if name not in inputs]
        if missing:
            raise InvalidInput(
                f"expected {len(required)} inputs but got {len(inputs)} inputs for model "
                f"'{self.name}'. Got input(s) {sorted(inputs)}, but missing required input(s) "
                f"{missing}. Please provide all required input(s)."
            )
        for name, value in inputs.items():
            spec = declared[name]
            given, wanted = np_to_triton_dtype(value.dtype), wire_type(spec.data_type)
            if given != wanted:
                raise InvalidInput(
                    f"inference input '{name}' data-type is '{given}', but model '{self.name}' "
                    f"expects '{wanted}'"
                )
            expected = self._full_dims(spec.dims)
            if len(value.shape) != len(expected) or any(
                e not in (-1, g) for e, g in zip(expected, value.shape, strict=True)
            ):
                raise InvalidInput(
                    f"unexpected shape for input '{name}' for model '{self.name}'. Expected "
                    f"{_dims(expected)}, got {_dims(value.shape)}"
                )
            if self.config.max_batch_size > 0 and value.shape[0] > self.config.max_batch_size:
                raise InvalidInput(
                    f"inference request batch-size must be <= {self.config.max_batch_size} for "
                    f"'{self.name}'"
                )

    async def infer(self, inputs: Tensors) -> Tensors:
        """Check and run one request (the gRPC path and an ensemble's steps alike)."""
        self.check_inputs(inputs)
        outputs = await self.run(inputs)
        for spec in self.config.output:
            value = outputs.get(spec.name)
            expected = self._full_dims(spec.dims)
            if (
                value is None
                or len(value.shape) != len(expected)
                or any(e not in (-1, g) for e, g in zip(expected, value.shape, strict=True))
            ):
                got = "nothing" if value is None else _dims(value.shape)
                raise BackendFailure(
                    f"output '{spec.name}' of model '{self.name}' is {got}, but its config "
                    f"declares {_dims(expected)}"
                )
        return outputs


@dataclass(frozen=True)
class _Fil:
    """Triton's FIL backend outputs over the library's predict: class probabilities, the class,
    or the raw prediction of a regressor."""

    predict: Callable[[np.ndarray], np.ndarray]
    is_classifier: bool
    predict_proba: bool
    threshold: float

    def __call__(self, inputs: Tensors) -> Tensors:
        raw = np.asarray(self.predict(inputs["input__0"]), dtype=np.float32)
        raw = raw.reshape(len(raw), -1)
        if not self.is_classifier:
            return {"output__0": raw}
        binary = raw.shape[1] == 1
        if self.predict_proba:
            # A binary model predicts P(class 1); FIL answers both classes' probabilities.
            return {"output__0": np.hstack([1 - raw, raw]) if binary else raw}
        labels = raw > self.threshold if binary else raw.argmax(axis=1)[:, None]
        return {"output__0": labels.astype(np.float32)}


def _fil_executor(config: model_config_pb2.ModelConfig, version_dir: Path) -> Execute:
    params = {k: v.string_value for k, v in config.parameters.items()}
    model_type = params.get("model_type", "xgboost")
    if model_type not in FIL_MODEL_FILES:
        raise ModelLoadError(
            f"failed to load '{config.name}': unknown model_type '{model_type}'; expected one "
            f"of: {', '.join(FIL_MODEL_FILES)}"
        )
    classifier = params.get("is_classifier", params.get("output_class"))
    if classifier not in ("true", "false"):
        raise ModelLoadError(
            f"failed to load '{config.name}': parameter is_classifier (output_class before "
            f"25.09) must be 'true' or 'false'"
        )
    if [t.name for t in config.input] != ["input__0"] or "output__0" not in {
        t.name for t in config.output
    }:
        raise ModelLoadError(
            f"failed to load '{config.name}': the FIL backend reads input__0 and writes output__0"
        )
    path = version_dir / (config.default_model_filename or FIL_MODEL_FILES[model_type])
    predict: Callable[[np.ndarray], np.ndarray]
    features: int
    if model_type == "lightgbm":
        import lightgbm

        lgb_booster = lightgbm.Booster(model_file=str(path))
        predict, features = lgb_booster.predict, lgb_booster.num_feature()
    else:
        import xgboost

        xgb_booster = xgboost.Booster(model_file=str(path))
        predict, features = xgb_booster.inplace_predict, xgb_booster.num_features()
    if list(config.input[0].dims) != [features]:
        raise ModelLoadError(
            f"failed to load '{config.name}': {path.name} has {features} features but input__0 "
            f"dims are {_dims(config.input[0].dims)}"
        )
    return _Fil(
        predict=predict,
        is_classifier=classifier == "true",
        predict_proba=params.get("predict_proba", "false") == "true",
        threshold=float(params.get("threshold", "0.5")),
    )


@dataclass(frozen=True)
class _Onnx:
    session: Any  # onnxruntime.InferenceSession
    outputs: tuple[str, ...]

    def __call__(self, inputs: Tensors) -> Tensors:
        return dict(zip(self.outputs, self.session.run(list(self.outputs), inputs), strict=True))


def _onnx_executor(config: model_config_pb2.ModelConfig, version_dir: Path) -> Execute:
    import onnxruntime

    path = version_dir / (config.default_model_filename or _DEFAULT_FILES["onnxruntime"])
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    graph_inputs = {i.name for i in session.get_inputs()}
    graph_outputs = {o.name for o in session.get_outputs()}
    unknown = [t.name for t in config.input if t.name not in graph_inputs] + [
        t.name for t in config.output if t.name not in graph_outputs
    ]
    if unknown:
        raise ModelLoadError(
            f"failed to load '{config.name}': {path.name} has no tensor {unknown[0]!r} "
            f"(inputs {sorted(graph_inputs)}, outputs {sorted(graph_outputs)})"
        )
    return _Onnx(session, tuple(t.name for t in config.output))


@dataclass(frozen=True)
class _TorchScript:
    module: Any  # torch.jit.ScriptModule
    input_order: tuple[str, ...]
    outputs: tuple[tuple[str, int], ...]
    """Each config output and its position in forward's result."""

    def __call__(self, inputs: Tensors) -> Tensors:
        import torch

        with torch.inference_mode():
            # torch.tensor copies: request buffers are read-only, torch wants writable ones.
            result = self.module(*(torch.tensor(inputs[name]) for name in self.input_order))
        results = result if isinstance(result, tuple | list) else (result,)
        return {name: results[index].numpy() for name, index in self.outputs}


def _torchscript_executor(config: model_config_pb2.ModelConfig, version_dir: Path) -> Execute:
    import torch

    path = version_dir / (config.default_model_filename or _DEFAULT_FILES["pytorch"])
    with warnings.catch_warnings():
        # torch deprecates TorchScript, but it is the format Triton's pytorch backend loads.
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(path), map_location="cpu").eval()
    names = [t.name for t in config.input]
    indices = [_INDEXED_NAME.fullmatch(n) for n in names]
    if all(indices):
        order = [
            n
            for _, n in sorted(
                (int(m.group(1)), n) for m, n in zip(indices, names, strict=True) if m
            )
        ]
    else:
        # Otherwise the inputs must be named as forward's arguments (after self).
        arguments = [a.name for a in module.forward.schema.arguments][1:]
        if sorted(arguments) != sorted(names):
            raise ModelLoadError(
                f"failed to load '{config.name}': inputs {names} follow neither the INPUT__<i> "
                f"convention nor forward's arguments {arguments}"
            )
        order = arguments
    outputs = []
    for position, spec in enumerate(config.output):
        match = _INDEXED_NAME.fullmatch(spec.name)
        outputs.append((spec.name, int(match.group(1)) if match else position))
    return _TorchScript(module, tuple(order), tuple(outputs))


_EXECUTORS: dict[str, Callable[[model_config_pb2.ModelConfig, Path], Execute]] = {
    "fil": _fil_executor,
    "onnxruntime": _onnx_executor,
    "pytorch": _torchscript_executor,
}


@dataclass
class ModelRepository:
    """The repository models a stand-in serves, loaded from Triton model repository folders."""

    models: dict[str, RepositoryModel] = field(default_factory=dict)

    @staticmethod
    def serves(config: model_config_pb2.ModelConfig) -> bool:
        """Whether this module executes the config's backend or platform."""
        return (
            config.platform == "ensemble"
            or (config.backend or _PLATFORM_BACKENDS.get(config.platform, "")) in _EXECUTORS
        )

    def load(self, model_dir: Path) -> RepositoryModel:
        """Load one model (an ensemble's steps too, from the same repository)."""
        config = read_config(model_dir)
        if config.name in self.models:
            return self.models[config.name]
        if config.platform == "ensemble":
            model = self._load_ensemble(config, model_dir.parent)
        else:
            model = self._load_backend_model(config, model_dir)
        self.models[config.name] = model
        return model

    def _load_backend_model(
        self, config: model_config_pb2.ModelConfig, model_dir: Path
    ) -> RepositoryModel:
        backend = config.backend or _PLATFORM_BACKENDS.get(config.platform, "")
        if backend not in _EXECUTORS:
            raise ModelLoadError(
                f"failed to load '{config.name}': backend '{backend}' is not one of "
                f"{', '.join(sorted(_EXECUTORS))} or an ensemble"
            )
        versions = sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit())
        if not versions:
            raise ModelLoadError(
                f"failed to load '{config.name}': no version folder in {model_dir}"
            )
        # Triton's default version policy serves the latest version only.
        version = str(versions[-1])
        try:
            execute = _EXECUTORS[backend](config, model_dir / version)
        except ModelLoadError:
            raise
        except Exception as exc:  # the library's own load error, as Triton reports it
            raise ModelLoadError(f"failed to load '{config.name}': {exc}") from exc
        batching = config.max_batch_size > 0 and config.HasField("dynamic_batching")
        scheduler = Scheduler(
            execute,
            instances=sum(g.count or 1 for g in config.instance_group) or 1,
            max_batch_size=config.max_batch_size if batching else 0,
            max_queue_delay_s=config.dynamic_batching.max_queue_delay_microseconds / 1e6,
        )
        return RepositoryModel(config, version, scheduler.infer, scheduler)

    def _load_ensemble(
        self, config: model_config_pb2.ModelConfig, repository: Path
    ) -> RepositoryModel:
        steps = list(config.ensemble_scheduling.step)
        for step in steps:
            self.load(repository / step.model_name)
        produced = {t.name for t in config.input}
        for step in steps:
            produced.update(step.output_map.values())
        unmade = [t.name for t in config.output if t.name not in produced] + [
            v for s in steps for v in s.input_map.values() if v not in produced
        ]
        if unmade:
            raise ModelLoadError(
                f"failed to load '{config.name}': ensemble tensor '{unmade[0]}' is produced by "
                f"no step and is not an ensemble input"
            )

        async def run(inputs: Tensors) -> Tensors:
            tensors, waiting = dict(inputs), list(steps)
            while waiting:
                ready = [s for s in waiting if all(v in tensors for v in s.input_map.values())]
                # Steps whose inputs exist run concurrently, as Triton's ensemble scheduler does.
                results = await asyncio.gather(
                    *(
                        self.models[s.model_name].infer(
                            {own: tensors[ens] for own, ens in s.input_map.items()}
                        )
                        for s in ready
                    )
                )
                for step, result in zip(ready, results, strict=True):
                    for own, ens in step.output_map.items():
                        tensors[ens] = result[own]
                waiting = [s for s in waiting if s not in ready]
            return {t.name: tensors[t.name] for t in config.output}

        return RepositoryModel(config, "1", run)

    async def handle(
        self, request: service_pb2.ModelInferRequest
    ) -> service_pb2.ModelInferResponse:
        """Answer one ModelInfer request; raises :class:`InvalidInput` or
        :class:`BackendFailure` with Triton's message."""
        model = self.models[request.model_name]
        prefix = f"[request id: {request.id or '<id_unknown>'}] "
        try:
            inputs = _decode_inputs(request)
            declared = {t.name: t for t in model.config.output}
            requested = [o.name for o in request.outputs] or list(declared)
            for name in requested:
                if name not in declared:
                    raise InvalidInput(
                        f"unexpected inference output '{name}' for model '{model.name}'"
                    )
            try:
                outputs = await model.infer(inputs)
            except (InvalidInput, BackendFailure):
                raise
            except Exception as exc:  # the library's error, which Triton returns as INTERNAL
                raise BackendFailure(f"{type(exc).__name__}: {exc}") from exc
        except (InvalidInput, BackendFailure) as exc:
            raise type(exc)(prefix + str(exc)) from exc
        response = service_pb2.ModelInferResponse(
            model_name=model.name, model_version=model.version, id=request.id
        )
        for name in requested:
            datatype = wire_type(declared[name].data_type)
            value = outputs[name]
            response.outputs.add(name=name, datatype=datatype, shape=list(value.shape))
            if datatype == "BYTES":
                response.raw_output_contents.append(serialize_byte_tensor(value).item())
            else:
                dtype = triton_to_np_dtype(datatype)
                response.raw_output_contents.append(np.ascontiguousarray(value, dtype).tobytes())
        return response


def _decode_inputs(request: service_pb2.ModelInferRequest) -> Tensors:
    """The request's tensors, from raw bytes (what tritonclient sends) or typed contents."""
    values: Tensors = {}
    for i, tensor in enumerate(request.inputs):
        shape = list(tensor.shape)
        if tensor.datatype not in _CONTENTS_FIELDS:
            raise InvalidInput(f"invalid datatype '{tensor.datatype}' for input '{tensor.name}'")
        if i < len(request.raw_input_contents):
            raw = request.raw_input_contents[i]
            if tensor.datatype == "BYTES":
                values[tensor.name] = deserialize_bytes_tensor(raw).reshape(shape)
                continue
            dtype = np.dtype(triton_to_np_dtype(tensor.datatype))
            expected = math.prod(shape) * dtype.itemsize
            if len(raw) != expected:
                raise InvalidInput(
                    f"unexpected total byte size {len(raw)} for input '{tensor.name}', expecting "
                    f"{expected}"
                )
            values[tensor.name] = np.frombuffer(raw, dtype=dtype).reshape(shape)
        else:
            contents = list(getattr(tensor.contents, _CONTENTS_FIELDS[tensor.datatype]))
            if len(contents) != math.prod(shape):
                raise InvalidInput(
                    f"unexpected number of elements {len(contents)} for input '{tensor.name}', "
                    f"expecting {math.prod(shape)}"
                )
            values[tensor.name] = np.array(
                contents, dtype=triton_to_np_dtype(tensor.datatype)
            ).reshape(shape)
    return values
