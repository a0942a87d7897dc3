"""A request's ``sampling_parameters`` checked before the stock backend reads them.

The stock backend (``utils/vllm_backend_utils.py``, ``TritonSamplingParams.from_dict``) builds
vLLM's ``SamplingParams`` from the request's JSON, logs any failure and returns ``None``; its
caller then fails on ``None.lora_name``, so a client sent a typo or an out-of-range value sees
only ``'NoneType' object has no attribute 'lora_name'``. JSON that is no object fails even
earlier, in the stock ``execute``, with a Python traceback. `check_sampling_parameters` builds
the same ``SamplingParams`` the same way and raises `InvalidSamplingParameters` with vLLM's own
reason, which the backend sends back instead.

Importable outside Triton's stub (no ``triton_python_backend_utils``).
"""

from __future__ import annotations

import json
from typing import Any

from vllm.sampling_params import SamplingParams, StructuredOutputsParams

from runtime.serving_backend import INVALID_PARAMETERS

__all__ = ["InvalidSamplingParameters", "check_sampling_parameters", "int_logit_bias"]

# The stock from_dict's conversions, keyed by SamplingParams' annotations (int | None hashes
# and compares equal to its Optional[int]).
_CONVERSIONS: dict[Any, type] = {int: int, float: float, bool: bool, str: str, int | None: int}
#: The stock backend's own field beside vLLM's (checked by the stock model against its LoRAs).
_STOCK_FIELDS = ("lora_name",)


class InvalidSamplingParameters(ValueError):
    """The request's sampling parameters cannot become vLLM's ``SamplingParams``."""


def check_sampling_parameters(text: str) -> dict[str, Any]:
    """The parsed parameters, or `InvalidSamplingParameters` where the stock backend would fail
    to build ``SamplingParams`` from ``text`` (or hand vLLM a ``logit_bias`` it refuses)."""
    try:
        parameters = json.loads(text)
    except ValueError as exc:
        raise InvalidSamplingParameters(f"sampling parameters are not JSON: {exc}") from None
    if not isinstance(parameters, dict):
        raise InvalidSamplingParameters(
            f"sampling parameters must be a JSON object, got {type(parameters).__name__}"
        )
    fields = {k: v for k, v in parameters.items() if k not in _STOCK_FIELDS}
    if not isinstance(fields.get("structured_outputs", ""), str):
        # The stock code json.loads the value: an object fails with "the JSON object must be
        # str, bytes or bytearray, not dict", which says nothing of the expected form.
        raise InvalidSamplingParameters(
            "structured_outputs must be a string holding the JSON object (the stock backend "
            'parses it as text): send "structured_outputs": "{\\"json\\": ...}", not an object'
        )
    annotations = SamplingParams.__annotations__
    try:
        for key, value in fields.items():
            if key == "structured_outputs":
                fields[key] = StructuredOutputsParams(**json.loads(value))
            elif key in annotations and annotations[key] in _CONVERSIONS:
                fields[key] = _CONVERSIONS[annotations[key]](value)
        sampling_params = SamplingParams(**fields)
    except Exception as exc:  # everything the stock from_dict swallows
        raise InvalidSamplingParameters(f"{INVALID_PARAMETERS}: {exc}") from None
    int_logit_bias(sampling_params)
    return parameters


def int_logit_bias(sampling_params: Any) -> Any:
    """``sampling_params`` with ``logit_bias`` keyed by integer token ids.

    The request's ``sampling_parameters`` are JSON, whose object keys are strings, and the
    stock backend builds vLLM's ``SamplingParams`` from them as they are: vLLM's token-id checks
    then fail the request with an empty message. Keys that are no integer are refused by name.
    """
    bias = getattr(sampling_params, "logit_bias", None)
    if not isinstance(bias, dict):
        return sampling_params
    converted: dict[Any, Any] = {}
    invalid = []
    for token, value in bias.items():
        try:
            converted[int(token)] = value
        except (ValueError, TypeError):
            invalid.append(token)
    if invalid:
        raise InvalidSamplingParameters(
            f"logit_bias keys must be integer token ids, got {invalid!r}"
        )
    sampling_params.logit_bias = converted
    return sampling_params
