"""The stock vLLM backend with three more outputs, ``prompt_logprobs`` (for ``/v1/score``),
``num_cached_tokens`` and ``stop_reason``, and vLLM's ``cache_salt`` taken from a request
parameter.

Two subclasses, each deferring everything it does not change to NVIDIA's code:

- `TritonPythonModel` auto-completes the model configuration as the stock model does, then
  declares ``prompt_logprobs`` (TYPE_STRING), ``num_cached_tokens`` (TYPE_UINT32) and
  ``stop_reason`` (TYPE_STRING) unless ``config.pbtxt`` already does; it answers a
  request whose sampling parameters vLLM cannot take with the reason
  (:mod:`runtime.serving_backend.sampling_parameters`) before the stock code sees it;
- `ScoringGenerateRequest` builds each generate response as the stock ``GenerateRequest``
  does, then, when vLLM returned prompt log-probabilities (the request's sampling parameters
  set ``prompt_logprobs``), appends them as that output, once per request, the count of
  prompt tokens served from the prefix cache to the last response, and each choice's
  ``stop_reason`` to every response in which one has finished; it gives vLLM the prompt
  with the request's ``cache_salt`` parameter, if it has one; it also hands the
  stock code vLLM's outputs with every choice of an ``n > 1`` request in them
  (:mod:`runtime.serving_backend.choices`), and ``logit_bias`` with integer token ids; streamed,
  it skips the outputs that vLLM's ``stream_interval`` would not have sent
  (:mod:`runtime.serving_backend.stream_interval`).

The stock ``TritonPythonModel._infer`` creates its request object through the name
``GenerateRequest`` in its own module, so that one name is rebound to the subclass in our
private copy of the stock module (:mod:`runtime.serving_backend.stock` loads it under its own
name; Triton's own ``vllm`` backend, in other stub processes, is untouched). Overriding
``_infer`` instead would mean copying it.

Needs ``triton_python_backend_utils`` (Triton's Python stub) and vLLM: importable only inside
the serving image, or in tests with the stand-ins of ``tests/support``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from vllm.v1.engine.exceptions import EngineGenerateError

from runtime.serving_backend import (
    CACHE_SALT_PARAMETER,
    CACHED_TOKENS_OUTPUT,
    INVALID_PARAMETERS,
    PROMPT_LOGPROBS_OUTPUT,
    STOP_REASON_OUTPUT,
)
from runtime.serving_backend.choices import ChoiceMerger
from runtime.serving_backend.prompt_logprobs import encode_prompt_logprobs
from runtime.serving_backend.sampling_parameters import (
    InvalidSamplingParameters,
    check_sampling_parameters,
    int_logit_bias,
)
from runtime.serving_backend.stock import load_stock_backend
from runtime.serving_backend.stream_interval import (
    IntervalGate,
    engine_stream_interval,
    request_stream_interval,
)

__all__ = [
    "CACHED_TOKENS_CONFIG",
    "PROMPT_LOGPROBS_CONFIG",
    "STOP_REASON_CONFIG",
    "ScoringGenerateRequest",
    "TritonPythonModel",
]

# The stock backend is Triton's own model.py, loaded at run time: its classes are untyped.
_stock: Any = load_stock_backend()

#: The output this backend declares; per-request, like the stock ``logprobs`` output.
PROMPT_LOGPROBS_CONFIG = {"name": PROMPT_LOGPROBS_OUTPUT, "data_type": "TYPE_STRING", "dims": [-1]}
#: Typed as the stock ``num_input_tokens``.
CACHED_TOKENS_CONFIG = {"name": CACHED_TOKENS_OUTPUT, "data_type": "TYPE_UINT32", "dims": [1]}
#: One element per choice, as the stock ``finish_reason``.
STOP_REASON_CONFIG = {"name": STOP_REASON_OUTPUT, "data_type": "TYPE_STRING", "dims": [-1]}
# Set in a request's response state once its prompt log-probabilities went out: vLLM repeats
# them on every streamed output (cumulative mode) or sends them once then [] (delta mode).
_SENT = "llm_serving_prompt_logprobs_sent"


class ScoringGenerateRequest(_stock.GenerateRequest):
    """The stock generate request, whose responses also carry ``prompt_logprobs`` and every
    choice of an ``n > 1`` request (`ChoiceMerger`), streamed every ``stream_interval`` tokens."""

    #: The stock request's call into vLLM (``AsyncLLM.generate`` with its arguments).
    executor_callback: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        generate = self.executor_callback
        engine_interval = engine_stream_interval(generate)
        self._interval = engine_interval

        def adjusted(prompt: Any, sampling_params: Any, *rest: Any, **kw: Any) -> Any:
            self._interval = request_stream_interval(sampling_params, engine_interval)
            salt = _cache_salt(self.triton_request)
            if salt is not None:
                # vLLM's TextPrompt; the stock code makes one itself only for images.
                prompt = (
                    {**prompt, "cache_salt": salt}
                    if isinstance(prompt, dict)
                    else {
                        "prompt": prompt,
                        "cache_salt": salt,
                    }
                )
            return generate(prompt, int_logit_bias(sampling_params), *rest, **kw)

        self.executor_callback = adjusted

    async def execute(self) -> Any:
        """The stock request's vLLM outputs, each holding all ``n`` choices; streamed, those
        `IntervalGate` lets through."""
        merger = ChoiceMerger(_requested_n(self.triton_request))
        gate: IntervalGate | None = None
        try:
            async for request_output in super().execute():
                merged = merger.merge(request_output)
                if self.stream:
                    # The stock execute reads the request (and calls vLLM) before its first
                    # output.
                    gate = gate or IntervalGate(self._interval)
                    if not gate.due(merged):
                        continue
                yield merged
        except EngineGenerateError as exc:
            # vLLM 0.27 wraps a plain ValueError from its input checks (a structured_outputs
            # regex, JSON schema or grammar that does not compile) in an EngineGenerateError
            # without a message, which the stock code sends on as "Error generating stream: ".
            if isinstance(exc.__cause__, ValueError):
                raise InvalidSamplingParameters(f"{INVALID_PARAMETERS}: {exc.__cause__}") from exc
            raise

    def create_response(
        self, request_output: Any, request_output_state: dict[str, Any], prepend_input: bool
    ) -> Any:
        """The stock response for ``request_output``, plus ``prompt_logprobs`` the first time
        vLLM's ``RequestOutput.prompt_logprobs`` is non-empty, ``stop_reason`` once a choice has
        finished, and ``num_cached_tokens`` on the last."""
        response = super().create_response(
            request_output=request_output,
            request_output_state=request_output_state,
            prepend_input=prepend_input,
        )
        added = []
        positions = request_output.prompt_logprobs
        if positions and not request_output_state.get(_SENT):
            request_output_state[_SENT] = True
            added.append(
                pb_utils.Tensor(
                    PROMPT_LOGPROBS_OUTPUT,
                    np.asarray([encode_prompt_logprobs(positions)], dtype=np.object_),
                )
            )
        choices = request_output.outputs
        if any(c.finish_reason is not None for c in choices):
            reasons = [json.dumps(c.stop_reason) for c in choices]
            added.append(pb_utils.Tensor(STOP_REASON_OUTPUT, np.asarray(reasons, np.object_)))
        cached = request_output.num_cached_tokens
        if request_output.finished and cached is not None:
            added.append(pb_utils.Tensor(CACHED_TOKENS_OUTPUT, np.asarray([cached], np.uint32)))
        if not added:
            return response
        return pb_utils.InferenceResponse(output_tensors=[*response.output_tensors(), *added])


def _parameters_text(request: Any) -> str:
    """The request's sampling parameters JSON, from where the stock backend reads it: the
    ``sampling_parameters`` tensor, else the request's own parameters (Triton's generate
    endpoint puts them there)."""
    tensor = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
    if tensor is None:
        return str(request.parameters())
    value = tensor.as_numpy()[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _cache_salt(request: Any) -> str | None:
    """The request's ``cache_salt`` parameter; `InvalidSamplingParameters` for one that would
    not partition the cache (not a non-empty string), or that the stock code would read as a
    sampling parameter (no ``sampling_parameters`` tensor: Triton's generate endpoint)."""
    try:
        parameters = json.loads(request.parameters())
    except ValueError:
        return None
    if not isinstance(parameters, dict) or CACHE_SALT_PARAMETER not in parameters:
        return None
    salt = parameters[CACHE_SALT_PARAMETER]
    if not isinstance(salt, str) or not salt:
        raise InvalidSamplingParameters(
            f"the {CACHE_SALT_PARAMETER} request parameter must be a non-empty string, got {salt!r}"
        )
    if pb_utils.get_input_tensor_by_name(request, "sampling_parameters") is None:
        raise InvalidSamplingParameters(
            f"the {CACHE_SALT_PARAMETER} request parameter needs the sampling parameters in "
            "the sampling_parameters tensor: without it the request's parameters are the "
            "sampling parameters, and vLLM's have no cache_salt"
        )
    return salt


def _requested_n(request: Any) -> int:
    """``n`` of the request's sampling parameters (1 when absent or unreadable)."""
    try:
        n = int(json.loads(_parameters_text(request)).get("n") or 1)
    except (ValueError, TypeError, AttributeError):
        return 1
    return max(n, 1)


class TritonPythonModel(_stock.TritonPythonModel):
    """The stock vLLM model, declaring this backend's outputs among its own and answering
    requests whose sampling parameters vLLM cannot take with the reason."""

    @classmethod
    def auto_complete_config(cls, auto_complete_model_config: Any) -> Any:
        config = super().auto_complete_config(auto_complete_model_config)
        declared = {output["name"] for output in config.as_dict().get("output", [])}
        for output in (PROMPT_LOGPROBS_CONFIG, CACHED_TOKENS_CONFIG, STOP_REASON_CONFIG):
            if output["name"] not in declared:
                config.add_output(dict(output))
        return config

    def execute(self, requests: list[Any]) -> None:
        """The stock ``execute`` for the requests whose sampling parameters
        `check_sampling_parameters` accepts; the others get its reason as their final response
        (the stock code would answer them with a Python error that names no parameter)."""
        accepted = []
        for request in requests:
            # Embedding requests take no sampling parameters: the stock code ignores them.
            if pb_utils.get_input_tensor_by_name(request, "embedding_request") is not None:
                accepted.append(request)
                continue
            try:
                _cache_salt(request)
                check_sampling_parameters(_parameters_text(request))
            except InvalidSamplingParameters as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            accepted.append(request)
        return super().execute(accepted)


_stock.GenerateRequest = ScoringGenerateRequest
