"""Our backend's declaration and responses, through the stand-ins of Triton's Python stub and
the stock vLLM backend, with vLLM's real ``RequestOutput``/``Logprob`` classes."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from vllm.logprobs import FlatLogprobs, Logprob
from vllm.outputs import CompletionOutput, RequestOutput

from runtime.frontend.kserve_engine import prompt_token_logprobs
from runtime.serving_backend import (
    CACHE_SALT_PARAMETER,
    CACHED_TOKENS_OUTPUT,
    PROMPT_LOGPROBS_OUTPUT,
    STOP_REASON_OUTPUT,
)
from runtime.serving_backend.prompt_logprobs import encode_prompt_logprobs
from runtime.serving_backend.stock import (
    HOOK_PARAMETERS,
    MODULE_NAME,
    StockBackendMismatch,
    check_response_hook,
    load_stock_backend,
)
from tests.support.toy_model import ToyModel
from tests.support.toy_vllm_engine import prompt_logprobs_of

PREFILL = {"max_tokens": 1, "prompt_logprobs": 0, "temperature": 0.0}
STOCK_OUTPUTS = [
    "text_output",
    "finish_reason",
    "cumulative_logprob",
    "logprobs",
    "num_input_tokens",
    "num_output_tokens",
]


def config_of(pb_utils: ModuleType, outputs: list[dict[str, Any]] | None = None) -> Any:
    """What Triton parses from the config.pbtxt the entrypoint renders (no tensors listed)."""
    return pb_utils.ModelConfig(
        {
            "name": "toy",
            "backend": "llm_serving_vllm",
            "input": [],
            "output": outputs or [],
            "parameters": {"REPORT_CUSTOM_METRICS": {"string_value": "true"}},
        }
    )


def loaded(backend: ModuleType, pb_utils: ModuleType) -> Any:
    config = backend.TritonPythonModel.auto_complete_config(config_of(pb_utils)).as_dict()
    model = backend.TritonPythonModel()
    model.initialize({"model_config": json.dumps(config), "model_name": "toy"})
    return model


def infer(
    model: Any,
    pb_utils: ModuleType,
    prompt: str,
    params: dict[str, Any],
    request_parameters: dict[str, Any] | None = None,
    **flags: bool,
) -> list[tuple[Any, int]]:
    tensors = [
        pb_utils.Tensor("text_input", np.asarray([prompt.encode()], dtype=np.object_)),
        pb_utils.Tensor(
            "sampling_parameters", np.asarray([json.dumps(params).encode()], dtype=np.object_)
        ),
        *(pb_utils.Tensor(k, np.asarray([v], dtype=bool)) for k, v in flags.items()),
    ]
    request = pb_utils.InferenceRequest(tensors, parameters=request_parameters)
    model.execute([request])
    return request.get_response_sender().sent


def outputs(response: Any) -> dict[str, list[Any]]:
    return {t.name(): t.as_numpy().tolist() for t in response.output_tensors()}


def test_auto_complete_declares_its_outputs_beside_the_stock_ones(
    backend: ModuleType, pb_utils: ModuleType
) -> None:
    config = backend.TritonPythonModel.auto_complete_config(config_of(pb_utils)).as_dict()
    names = [o["name"] for o in config["output"]]
    assert names == [
        *STOCK_OUTPUTS,
        PROMPT_LOGPROBS_OUTPUT,
        CACHED_TOKENS_OUTPUT,
        STOP_REASON_OUTPUT,
    ]
    types = {o["name"]: o["data_type"] for o in config["output"]}
    assert types[PROMPT_LOGPROBS_OUTPUT] == types[STOP_REASON_OUTPUT] == "TYPE_STRING"
    assert types[CACHED_TOKENS_OUTPUT] == types["num_input_tokens"] == "TYPE_UINT32"
    # The stock completion still ran: decoupled, no Triton batching, its inputs.
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert config["max_batch_size"] == 0
    assert "sampling_parameters" in {i["name"] for i in config["input"]}


def test_auto_complete_keeps_an_output_config_pbtxt_already_declares(
    backend: ModuleType, pb_utils: ModuleType
) -> None:
    mine = {"name": PROMPT_LOGPROBS_OUTPUT, "data_type": "TYPE_STRING", "dims": [1]}
    config = backend.TritonPythonModel.auto_complete_config(config_of(pb_utils, [mine]))
    found = [o for o in config.as_dict()["output"] if o["name"] == PROMPT_LOGPROBS_OUTPUT]
    assert found == [mine]


def test_a_prefill_request_returns_the_models_prompt_logprobs(
    backend: ModuleType, pb_utils: ModuleType
) -> None:
    model = loaded(backend, pb_utils)
    prompt = "the cat sat on"
    ((response, flags),) = infer(model, pb_utils, prompt, PREFILL, exclude_input_in_output=True)
    assert flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    out = outputs(response)
    assert list(out) == [
        "text_output",
        PROMPT_LOGPROBS_OUTPUT,
        STOP_REASON_OUTPUT,
        CACHED_TOKENS_OUTPUT,
    ]
    (encoded,) = out[PROMPT_LOGPROBS_OUTPUT]
    rows = json.loads(encoded)
    toy = ToyModel().prompt_logprobs(prompt)
    assert rows[0] is None and len(rows) == len(toy) == 4
    for row, expected in zip(rows[1:], toy[1:], strict=True):
        ((token, value),) = expected.items()  # type: ignore[union-attr]
        assert list(row) == [str(token)]
        assert row[str(token)]["logprob"] == value and row[str(token)]["rank"] == 1
    # Read back exactly as the frontend's scoring reads it.
    expected = [0.0, *(next(iter(r.values())) for r in toy[1:] if r is not None)]
    assert prompt_token_logprobs(encoded.decode()) == expected


def test_requests_without_prompt_logprobs_get_the_stock_response_unchanged(
    backend: ModuleType, pb_utils: ModuleType
) -> None:
    model = loaded(backend, pb_utils)
    params = {"max_tokens": 3, "temperature": 0.0}
    ((ours, _),) = infer(model, pb_utils, "the sky", params, return_finish_reason=True)
    stock_class = sys.modules[MODULE_NAME].TritonPythonModel
    stock = stock_class()
    text_output = {"name": "text_output", "data_type": "TYPE_STRING"}
    stock.initialize({"model_config": json.dumps({"output": [text_output]})})
    # The stock model's own _infer now builds our request class too; the request class is the
    # only difference, and without prompt_logprobs it adds only the stop reason and the cached
    # prompt tokens.
    ((theirs, _),) = infer(stock, pb_utils, "the sky", params, return_finish_reason=True)
    added = {STOP_REASON_OUTPUT: ["null"], CACHED_TOKENS_OUTPUT: [0]}
    assert outputs(ours) == {**outputs(theirs), **added}


def test_a_stream_carries_prompt_logprobs_once(backend: ModuleType, pb_utils: ModuleType) -> None:
    model = loaded(backend, pb_utils)
    params = {**PREFILL, "max_tokens": 3}
    sent = infer(model, pb_utils, "the dog", params, stream=True)
    assert len(sent) == 3 and sent[-1][1] == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    carrying = [i for i, (r, _) in enumerate(sent) if PROMPT_LOGPROBS_OUTPUT in outputs(r)]
    assert carrying == [0]


def test_a_stream_goes_out_every_stream_interval_tokens(
    backend: ModuleType, pb_utils: ModuleType
) -> None:
    # The stock backend streams vLLM's cumulative outputs, which vLLM 0.27.1 does not batch.
    model = loaded(backend, pb_utils)
    params = {"max_tokens": 9, "temperature": 0.0}
    flags = {"stream": True, "return_num_output_tokens": True}
    each = infer(model, pb_utils, "the cat", params, **flags)
    batched = infer(model, pb_utils, "the cat", {**params, "stream_interval": 4}, **flags)
    assert [outputs(r)["num_output_tokens"] for r, _ in each] == [[1]] * 9
    assert [outputs(r)["num_output_tokens"] for r, _ in batched] == [[1], [4], [4]]
    assert batched[-1][1] == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

    def text(sent: list[tuple[Any, int]]) -> bytes:
        return b"".join(outputs(r)["text_output"][0] for r, _ in sent)

    assert text(batched) == text(each)


def test_the_last_response_counts_the_prompt_tokens_the_prefix_cache_served(
    backend: ModuleType, pb_utils: ModuleType
) -> None:
    model = loaded(backend, pb_utils)
    prompt = "the cat sat on the mat and the dog ran"  # ten toy tokens: two whole blocks
    params = {"max_tokens": 3, "temperature": 0.0}

    def cached(salt: str | None = None) -> int:
        salted = {CACHE_SALT_PARAMETER: salt} if salt else None
        sent = infer(model, pb_utils, prompt, params, salted, stream=True)
        counts = [outputs(r).get(CACHED_TOKENS_OUTPUT) for r, _ in sent]
        assert counts[:-1] == [None] * (len(sent) - 1)  # on the last response only
        (count,) = counts[-1]
        return count

    assert (cached(), cached()) == (0, 8)
    # The request's cache_salt reaches vLLM with the prompt: only the same salt shares blocks.
    assert (cached("tenant-a"), cached("tenant-a"), cached("tenant-b")) == (0, 8, 0)


def test_a_finished_choice_carries_the_stop_string_or_token_that_ended_it(
    backend: ModuleType, pb_utils: ModuleType
) -> None:
    model = loaded(backend, pb_utils)
    free = infer(model, pb_utils, "the", {"max_tokens": 6, "temperature": 0.0}, stream=True)
    words = b"".join(outputs(r)["text_output"][0] for r, _ in free).decode().split()
    (token,) = ToyModel().tokenize(words[1])
    for stop, expected in (({"stop": [words[2]]}, words[2]), ({"stop_token_ids": [token]}, token)):
        params = {"max_tokens": 6, "temperature": 0.0, **stop}
        sent = infer(model, pb_utils, "the", params, stream=True)
        reasons = [outputs(r).get(STOP_REASON_OUTPUT) for r, _ in sent]
        # Only once the choice has finished: a stream pays nothing per token for it.
        assert reasons[:-1] == [None] * (len(sent) - 1)
        assert [json.loads(r) for r in reasons[-1]] == [expected]


def test_a_cache_salt_that_would_not_partition_the_cache_is_refused(
    backend: ModuleType, pb_utils: ModuleType
) -> None:
    model = loaded(backend, pb_utils)
    prompt = pb_utils.Tensor("text_input", np.asarray([b"the cat"], dtype=np.object_))
    params = {"max_tokens": 2}
    tensor = pb_utils.Tensor(
        "sampling_parameters", np.asarray([json.dumps(params).encode()], dtype=np.object_)
    )
    requests = [
        # An int64 KServe parameter, and an empty salt: vLLM would share the cache unsalted.
        pb_utils.InferenceRequest([prompt, tensor], parameters={CACHE_SALT_PARAMETER: 7}),
        pb_utils.InferenceRequest([prompt, tensor], parameters={CACHE_SALT_PARAMETER: ""}),
        # Without the tensor the request's parameters are the sampling parameters.
        pb_utils.InferenceRequest([prompt], parameters={**params, CACHE_SALT_PARAMETER: "a"}),
        pb_utils.InferenceRequest([prompt, tensor], parameters={CACHE_SALT_PARAMETER: "a"}),
    ]
    model.execute(requests)
    reasons = ("non-empty string, got 7", "non-empty string, got ''", "sampling_parameters tensor")
    for request, reason in zip(requests[:3], reasons, strict=True):
        ((response, _),) = request.get_response_sender().sent
        assert response.error().code() == pb_utils.TritonError.INVALID_ARG
        assert reason in response.error().message()
    ((served, _),) = requests[3].get_response_sender().sent
    assert not served.has_error() and outputs(served)["text_output"]


def test_flat_and_list_prompt_logprobs_encode_alike() -> None:
    toy = ToyModel()
    as_list = prompt_logprobs_of(toy, "a red sky today")
    flat = prompt_logprobs_of(toy, "a red sky today", flat=True)
    assert isinstance(flat, FlatLogprobs)
    assert encode_prompt_logprobs(flat) == encode_prompt_logprobs(as_list)


def test_the_stock_module_builds_our_request_and_keeps_the_hooks_signature(
    backend: ModuleType,
) -> None:
    stock = sys.modules[MODULE_NAME]
    ours = check_response_hook(stock)  # also checks our override kept the stock parameters
    assert ours.__name__ == "ScoringGenerateRequest"
    assert ours.__mro__[1] is sys.modules["utils.request"].GenerateRequest
    assert issubclass(backend.TritonPythonModel, stock.TritonPythonModel)
    output = RequestOutput(
        request_id="r",
        prompt="the",
        prompt_token_ids=[1],
        prompt_logprobs=[None, {3: Logprob(-1.5, 2, "cat")}],
        outputs=[CompletionOutput(0, "", [], None, None)],
        finished=True,
    )
    assert json.loads(encode_prompt_logprobs(output.prompt_logprobs)) == [
        None,
        {"3": {"logprob": -1.5, "rank": 2, "decoded_token": "cat"}},
    ]


def test_a_stock_backend_with_another_hook_is_refused(backend: ModuleType) -> None:
    legacy = ModuleType("legacy_stock")

    class GenerateRequest:
        def create_response(self, request_output_state, request_output, prepend_input, extra):  # type: ignore[no-untyped-def]
            return None

    legacy.GenerateRequest = GenerateRequest  # type: ignore[attr-defined]
    with pytest.raises(StockBackendMismatch, match="request_output_state"):
        check_response_hook(legacy)
    with pytest.raises(StockBackendMismatch, match=r"no GenerateRequest\.create_response"):
        check_response_hook(ModuleType("older_stock"))
    assert HOOK_PARAMETERS[1:] == ("request_output", "request_output_state", "prepend_input")


def test_a_missing_stock_backend_names_the_variable(tmp_path: Any, backend: ModuleType) -> None:
    saved = sys.modules.pop(MODULE_NAME)
    try:
        with pytest.raises(StockBackendMismatch, match="LLM_SERVING_STOCK_VLLM_BACKEND_DIR"):
            load_stock_backend(tmp_path)
    finally:
        sys.modules[MODULE_NAME] = saved


class PerChoiceEngine:
    """The toy engine's outputs as vLLM V1 emits those of an ``n > 1`` request: one output per
    choice that advanced, holding that choice only, the last one marked finished."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[RequestOutput]:
        async for output in self.engine.generate(*args, **kwargs):
            for i, choice in enumerate(output.outputs):
                one = copy.copy(output)
                one.outputs = [choice]
                one.finished = output.finished and i == len(output.outputs) - 1
                yield one


def test_n_in_the_requests_parameters_gets_every_choice(
    backend: ModuleType, pb_utils: ModuleType
) -> None:
    # Triton's generate endpoint hands the stock backend its "parameters" this way, with no
    # sampling_parameters tensor; the answer held only the choice that finished last.
    model = loaded(backend, pb_utils)
    model._llm_engine = PerChoiceEngine(model._llm_engine)
    params = {"max_tokens": 3, "n": 2, "temperature": 0.8, "seed": 1}
    prompt = pb_utils.Tensor("text_input", np.asarray([b"the cat"], dtype=np.object_))
    flag = pb_utils.Tensor("return_finish_reason", np.asarray([True], dtype=bool))
    request = pb_utils.InferenceRequest([prompt, flag], parameters=params)
    model.execute([request])
    ((response, _),) = request.get_response_sender().sent
    assert outputs(response)["finish_reason"] == [b"length", b"length"]
    assert len(outputs(response)["text_output"]) == 2


def test_a_request_vllm_cannot_take_is_answered_with_the_reason(
    backend: ModuleType, pb_utils: ModuleType
) -> None:
    # The stock code answered "'NoneType' object has no attribute 'lora_name'", or, for JSON
    # that is no object, a Python traceback from its execute.
    model = loaded(backend, pb_utils)
    bad = {"max_tokens": 3, "temperature": -1}
    good = {"max_tokens": 3, "temperature": 0.0}
    tensors = [
        pb_utils.Tensor("text_input", np.asarray([b"the cat"], dtype=np.object_)),
        pb_utils.Tensor("sampling_parameters", np.asarray([b"[1]"], dtype=np.object_)),
    ]
    requests = [
        pb_utils.InferenceRequest([tensors[0]], parameters=bad),
        pb_utils.InferenceRequest(tensors),
        pb_utils.InferenceRequest([tensors[0]], parameters=good),
    ]
    model.execute(requests)
    reasons = ("temperature must be non-negative", "got list")
    for request, reason in zip(requests[:2], reasons, strict=True):
        ((response, flags),) = request.get_response_sender().sent
        assert flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        assert response.error().code() == pb_utils.TritonError.INVALID_ARG
        assert reason in response.error().message()
    ((served, _),) = requests[2].get_response_sender().sent
    assert not served.has_error() and outputs(served)["text_output"]
