"""Sampling combinations vLLM's ``SamplingParams`` refuses are 400s naming the field, before
anything reaches Triton: the stock backend turns vLLM's refusal into a failed request (a 502).

Checked against vLLM 0.27.1's own ``SamplingParams`` (the pinned engine) over a grid of values,
on the KServe stand-in (nothing is sent) and on real Triton with the real engine."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest

from runtime.frontend.errors import InvalidRequestError
from runtime.frontend.sampling import build_sampling
from runtime.frontend.schemas import ChatCompletionRequest, CompletionRequest
from tests.frontend.conftest import Served

MODEL = "toy-llm"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
COMPLETION = {"model": MODEL, "prompt": "the cat", "max_tokens": 3}

REFUSED = [
    pytest.param({"n": 2, "temperature": 0}, "n", id="n=2,temperature=0"),
    pytest.param({"n": 3, "temperature": 0.0}, "n", id="n=3,temperature=0.0"),
    pytest.param({"stop": ""}, "stop", id="stop=''"),
    pytest.param({"stop": ["END", ""]}, "stop", id="stop=['END','']"),
]


def _sampling(request: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    return build_sampling(request, max_tokens=3, logprobs=None, structured=None, vocab_size=64)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(("fields", "param"), REFUSED)
def test_refused_before_the_backend(
    frontend: Served, path: str, fields: dict[str, Any], param: str
) -> None:
    before = len(frontend.requests)
    base = CHAT if path.endswith("chat/completions") else COMPLETION
    response = httpx.post(frontend.url + path, json={**base, **fields}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    # The message names the field and says what to send instead.
    assert param in error["message"] and "send" in error["message"]
    assert len(frontend.requests) == before


def test_a_tiny_temperature_is_not_greedy(frontend: Served) -> None:
    # vLLM raises a temperature in (0, 0.01) to 0.01 before its greedy test, so it takes n=2.
    body = {**CHAT, "n": 2, "temperature": 1e-6}
    response = httpx.post(frontend.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert frontend.requests[-1].sampling_parameters["temperature"] == 1e-6


TEMPERATURES = (None, 0, 0.0, 1e-7, 1e-5, 0.005, 0.01, 1.0)
STOPS: tuple[Any, ...] = (None, "", "x", [], ["x"], ["x", ""], ["", "y"])


@pytest.mark.parametrize("kind", [ChatCompletionRequest, CompletionRequest])
def test_refuses_exactly_what_vllm_refuses(kind: type) -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    base = CHAT if kind is ChatCompletionRequest else COMPLETION
    for n, temperature, stop in itertools.product((None, 1, 2, 5), TEMPERATURES, STOPS):
        fields = {"n": n, "temperature": temperature, "stop": stop}
        request = kind(**base, **{k: v for k, v in fields.items() if v is not None})
        sent = {k: v for k, v in fields.items() if v is not None}
        try:
            SamplingParams(max_tokens=3, **sent)
            vllm_refuses = False
        except VLLMValidationError:
            vllm_refuses = True
        try:
            _sampling(request)
            refused = False
        except InvalidRequestError:
            refused = True
        assert refused == vllm_refuses, fields


@pytest.mark.parametrize(("fields", "param"), REFUSED)
def test_real_engine_gets_a_400_not_a_502(
    real_frontend: Served, fields: dict[str, Any], param: str
) -> None:
    response = httpx.post(
        real_frontend.url + "/v1/chat/completions", json={**CHAT, **fields}, timeout=60
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_real_engine_samples_two_choices_at_a_tiny_temperature(real_frontend: Served) -> None:
    body = {**CHAT, "n": 2, "temperature": 1e-6}
    response = httpx.post(real_frontend.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert [c["index"] for c in response.json()["choices"]] == [0, 1]


CONSTRAINTS = {"version": 1, "banned_tokens": [3]}


def test_constraints_beside_response_format_are_refused_before_the_backend(
    frontend: Served,
) -> None:
    # The engine's constraint processor refuses the pair (validate_params), which the stock
    # backend would return as a failed request.
    before = len(frontend.requests)
    body = {**CHAT, "response_format": {"type": "json_object"}, "constraints": CONSTRAINTS}
    response = httpx.post(frontend.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "constraints" and "response_format" in error["message"]
    assert len(frontend.requests) == before
    alone = httpx.post(
        frontend.url + "/v1/chat/completions", json={**CHAT, "constraints": CONSTRAINTS}, timeout=30
    )
    assert alone.status_code == 200, alone.text


def test_constraints_beside_a_forced_tool_call_are_refused() -> None:
    # A tool_choice that forces a call reaches build_sampling as structured outputs too.
    request = ChatCompletionRequest(**CHAT, constraints=CONSTRAINTS)
    with pytest.raises(InvalidRequestError) as refused:
        build_sampling(
            request,
            max_tokens=3,
            logprobs=None,
            structured=("structured_outputs", '{"json": {"type": "object"}}'),
            vocab_size=64,
        )
    assert refused.value.param == "constraints"
    assert "extra_args" in _sampling(request)


def test_constraints_reach_the_engine_as_the_client_sent_them() -> None:
    # The engine parses them with the same schema; a parsed-and-dumped copy would rebuild every
    # row of a token machine on the frontend's event loop.
    machine = {"num_states": 2, "accepting_states": [1], "transitions": [[0, 5, 1], [1, 6, 1]]}
    constraints = {"version": 1, "token_machine": machine}
    request = ChatCompletionRequest(**CHAT, constraints=constraints)
    sent = _sampling(request)["extra_args"]["constraints"]
    assert sent == constraints
    assert (
        sent["token_machine"]["transitions"] is request.constraints["token_machine"]["transitions"]
    )
