"""A stand-in for ``triton_python_backend_utils``, the module Triton's Python stub provides.

The real module exists only inside Triton's Python stub (it talks to the stub's shared
memory), which the real-Triton tests run; the backend's unit tests, in this interpreter, put
this folder on ``sys.path`` instead. It has the pieces the vLLM backend and
ours use, with the real names and call shapes: `Tensor` (``name()``, ``as_numpy()``),
`InferenceRequest` (``inputs()``, ``parameters()``, ``get_response_sender()``),
`InferenceResponse` (``output_tensors()``, ``has_error()``, ``error()``), `TritonError`
(with its ``CANCELLED``/``UNAVAILABLE`` codes), `TritonModelException`, `Logger`,
`ModelConfig` (the object ``auto_complete_config`` receives: ``as_dict``, ``add_input``,
``add_output``, ``set_max_batch_size``, ``set_model_transaction_policy``),
``get_input_tensor_by_name``, ``get_output_config_by_name``, ``triton_string_to_numpy``,
``using_decoupled_model_transaction_policy``, ``get_model_dir`` and
``TRITONSERVER_RESPONSE_COMPLETE_FINAL``. It never runs in product code.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

_TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT32": np.uint32,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

#: What ``get_model_dir()`` answers; a test sets it to the rendered version folder.
MODEL_DIR = ""


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return _TRITON_STRING_TO_NUMPY[triton_type_string]


def get_model_dir() -> str:
    return MODEL_DIR


class TritonModelException(Exception):
    """Raised by the stub's calls that fail."""


class TritonError:
    """An error carried by a response (``code`` as in the real class)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Tensor:
    """A named numpy array; string tensors are ``np.object_`` arrays of bytes, as in Triton."""

    def __init__(self, name: str, numpy_array: np.ndarray) -> None:
        if numpy_array.dtype.type == np.str_:
            raise TritonModelException(
                "Tensor dtype used for numpy_array is not supported by Python backend. "
                "Please use np.object_ instead."
            )
        self._name = name
        self._array = numpy_array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: Any = None) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list):
            raise TritonModelException('"output_tensors" must be a list.')
        self._output_tensors = output_tensors
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> Any:
        return self._error


class ResponseSender:
    """Collects what a decoupled model sends, as ``(response, flags)`` pairs."""

    def __init__(self) -> None:
        self.sent: list[tuple[InferenceResponse, int]] = []

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self.sent and self.sent[-1][1] == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise TritonModelException("response sender already closed")
        self.sent.append((response, flags))  # type: ignore[arg-type]

    def is_cancelled(self) -> bool:
        return False


class InferenceRequest:
    def __init__(
        self,
        inputs: list[Tensor],
        requested_output_names: list[str] | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self._inputs = inputs
        self._requested = requested_output_names or []
        self._parameters = json.dumps(parameters or {})
        self._sender = ResponseSender()

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested

    def parameters(self) -> str:
        return self._parameters

    def get_response_sender(self) -> ResponseSender:
        return self._sender


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for output in model_config.get("output", []):
        if output["name"] == name:
            return output
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class ModelConfig:
    """The configuration ``auto_complete_config`` completes (Triton parses ``config.pbtxt``
    into this dict: ``input``/``output`` lists, ``parameters`` as ``{key: {string_value}}``)."""

    def __init__(self, model_config: dict[str, Any]) -> None:
        self._config = model_config
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def _add(self, kind: str, tensor: dict[str, Any]) -> None:
        for existing in self._config[kind]:
            if existing["name"] == tensor["name"]:
                raise TritonModelException(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model "
                    f"'{self._config.get('name', '')}' is already in the model config"
                )
        self._config[kind].append(dict(tensor))

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)

    def set_max_batch_size(self, max_batch_size: int) -> None:
        self._config["max_batch_size"] = max_batch_size

    def set_model_transaction_policy(self, policy: dict[str, Any]) -> None:
        self._config["model_transaction_policy"] = dict(policy)


class Logger:
    """Triton's logger: class-level calls, as ``pb_utils.Logger.log_info(...)``."""

    records: ClassVar[list[tuple[str, str]]] = []

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.records.append(("info", message))

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.records.append(("warn", message))

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.records.append(("error", message))

    @classmethod
    def log_verbose(cls, message: str) -> None:
        cls.records.append(("verbose", message))
