"""Streamed tool calls: the official openai client (sync and async) against the frontend, a toy
model that writes one or two hermes tool calls a few characters a token, every tool_choice;
accumulated deltas equal the non-streamed result for the same request.

On the KServe stand-in: a random-weight model cannot be made to write a tool call on purpose,
so the toy's scripted replies stand in for one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.frontend.errors import InvalidOutputError, TruncatedOutputError
from runtime.frontend.tool_parsers import (
    HermesToolStream,
    NamedToolStream,
    RequiredToolStream,
    ToolDelta,
    ToolStream,
)
from tests.frontend.conftest import (
    TWO_CALLS,
    WEATHER_CALL,
    Served,
    make_settings,
    serve,
)
from tests.support.kserve_server import KServeStandIn

MODEL = "toy-llm"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}, "h24": {"type": "boolean"}},
            "required": ["zone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
ASK_ONE = [{"role": "user", "content": "what is the weather in Paris"}]
ASK_TWO = [{"role": "user", "content": "the weather in Paris and the time in Rome"}]


@pytest.fixture(scope="module")
def tools_frontend(standin: KServeStandIn, tokenizer_dir: Path) -> Iterator[Served]:
    settings = make_settings(standin, tokenizer_dir, model_name="llm-tools", max_model_len=512)
    served = serve(settings, standin)
    yield served
    served.stop()


@pytest.fixture
def client(tools_frontend: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tools_frontend.url}/v1", api_key="x", max_retries=0)


def _accumulate(chunks: Iterable[Any]) -> dict[str, Any]:
    """What a client rebuilds from a stream: content, calls by index, fragments per call."""
    content, calls, finish, roles = "", {}, None, []
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.role:
                roles.append(delta.role)
            content += delta.content or ""
            for part in delta.tool_calls or []:
                call = calls.setdefault(part.index, {"ids": [], "name": "", "fragments": []})
                if part.id is not None:
                    call["ids"].append(part.id)
                    assert part.type == "function"
                if part.function.name is not None:
                    call["name"] += part.function.name
                call["fragments"].append(part.function.arguments or "")
            finish = choice.finish_reason or finish
    return {"content": content, "calls": calls, "finish": finish, "roles": roles}


def _same_as_whole(streamed: dict[str, Any], whole: Any) -> None:
    message = whole.choices[0].message
    assert streamed["roles"] == ["assistant"]
    assert streamed["finish"] == whole.choices[0].finish_reason
    assert (streamed["content"] or None) == message.content
    expected = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    got = [(c["name"], "".join(c["fragments"])) for _, c in sorted(streamed["calls"].items())]
    assert got == expected
    for call in streamed["calls"].values():
        assert len(call["ids"]) == 1 and call["ids"][0].startswith("call_")


def test_sync_stream_of_one_call_equals_the_whole_response(client: openai.OpenAI) -> None:
    request = {"model": MODEL, "messages": ASK_ONE, "tools": TOOLS, "max_tokens": 200}
    whole = client.chat.completions.create(**request)
    streamed = _accumulate(client.chat.completions.create(**request, stream=True))
    _same_as_whole(streamed, whole)
    assert streamed["finish"] == "tool_calls" and streamed["content"] == "Let me check."
    (call,) = streamed["calls"].values()
    assert call["name"] == "get_weather"
    assert json.loads("".join(call["fragments"])) == {"city": "Paris", "unit": "celsius"}
    assert len([f for f in call["fragments"] if f]) >= 10  # split across many chunks


async def test_async_stream_of_two_calls_equals_the_whole_response(tools_frontend: Served) -> None:
    client = openai.AsyncOpenAI(base_url=f"{tools_frontend.url}/v1", api_key="x", max_retries=0)
    request = {"model": MODEL, "messages": ASK_TWO, "tools": TOOLS, "max_tokens": 200}
    whole = await client.chat.completions.create(**request)
    stream = await client.chat.completions.create(**request, stream=True)
    streamed = _accumulate([chunk async for chunk in stream])
    await client.close()
    _same_as_whole(streamed, whole)
    assert streamed["content"] == "" and whole.choices[0].message.content is None
    assert [c["name"] for _, c in sorted(streamed["calls"].items())] == ["get_weather", "get_time"]
    ids = [c["ids"][0] for c in streamed["calls"].values()]
    assert len(set(ids)) == 2
    arguments = [json.loads("".join(c["fragments"])) for _, c in sorted(streamed["calls"].items())]
    assert arguments == [{"city": "Paris"}, {"zone": "Europe/Rome", "h24": True}]


def test_tool_choice_none_streams_plain_text(client: openai.OpenAI, tools_frontend: Served) -> None:
    request = {
        "model": MODEL,
        "messages": ASK_ONE,
        "tools": TOOLS,
        "tool_choice": "none",
        "max_tokens": 6,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**request)
    streamed = _accumulate(client.chat.completions.create(**request, stream=True))
    assert "Tools: " not in tools_frontend.standin.requests[-1].text_input
    assert streamed["calls"] == {} and streamed["finish"] == "length"
    assert streamed["content"] == whole.choices[0].message.content
    assert len(streamed["content"].split()) == 6


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
def test_forced_calls_stream_like_the_whole_response(
    client: openai.OpenAI, tools_frontend: Served, choice: Any
) -> None:
    request = {
        "model": MODEL,
        "messages": ASK_ONE,
        "tools": TOOLS,
        "tool_choice": choice,
        "max_tokens": 60,
    }
    whole = client.chat.completions.create(**request)
    streamed = _accumulate(client.chat.completions.create(**request, stream=True))
    sent = tools_frontend.standin.requests[-1].sampling_parameters
    assert "structured_outputs" in sent
    _same_as_whole(streamed, whole)
    assert streamed["finish"] == "tool_calls"
    (call,) = streamed["calls"].values()
    name = "get_weather" if choice == "required" else "get_time"
    assert call["name"] == name and json.loads("".join(call["fragments"]))


def _stream_events(served: Served, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_a_malformed_call_ends_the_stream_with_an_error_event(tools_frontend: Served) -> None:
    messages = [{"role": "user", "content": "make a broken call"}]
    body = {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 100}
    whole = httpx.post(tools_frontend.url + "/v1/chat/completions", json=body, timeout=30)
    assert whole.status_code == 502 and whole.json()["error"]["code"] == "invalid_tool_call"
    events = _stream_events(tools_frontend, {**body, "stream": True})
    assert events[-1]["error"]["code"] == "invalid_tool_call"


def _strict(tool: dict[str, Any], properties: dict[str, Any]) -> dict[str, Any]:
    parameters = {
        "type": "object",
        "properties": properties,
        "required": ["city"],
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {**tool["function"], "strict": True, "parameters": parameters},
    }


def _invalid_count(served: Served) -> float:
    value = served.state.metrics.registry.get_sample_value(
        "llm_serving_frontend_invalid_output_total",
        {"model": MODEL, "route": "/v1/chat/completions"},
    )
    return value or 0.0


def test_strict_arguments_that_break_the_parameters_are_withheld(tools_frontend: Served) -> None:
    # The model writes {"city": "Paris", "unit": "celsius"}: city is no integer.
    tool = _strict(WEATHER, {"city": {"type": "integer"}, "unit": {"type": "string"}})
    body = {"model": MODEL, "messages": ASK_ONE, "tools": [tool], "max_tokens": 200}
    before = _invalid_count(tools_frontend)
    whole = httpx.post(tools_frontend.url + "/v1/chat/completions", json=body, timeout=30)
    assert whole.status_code == 502, whole.text
    error = whole.json()["error"]
    assert error["code"] == "invalid_tool_call" and error["param"] == "tools"
    assert "get_weather" in error["message"] and "city" in error["message"]
    events = _stream_events(tools_frontend, {**body, "stream": True})
    assert events[-1]["error"]["code"] == "invalid_tool_call"
    assert _invalid_count(tools_frontend) == before + 2
    # Without strict the same call is returned as the model wrote it.
    lax = {**tool, "function": {**tool["function"], "strict": False}}
    reply = httpx.post(
        tools_frontend.url + "/v1/chat/completions", json={**body, "tools": [lax]}, timeout=30
    )
    assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_strict_arguments_that_satisfy_the_parameters_are_returned(client: openai.OpenAI) -> None:
    tool = _strict(WEATHER, {"city": {"type": "string"}, "unit": {"type": "string"}})
    request = {"model": MODEL, "messages": ASK_ONE, "tools": [tool], "max_tokens": 200}
    whole = client.chat.completions.create(**request)
    (call,) = whole.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    _same_as_whole(_accumulate(client.chat.completions.create(**request, stream=True)), whole)


def test_a_call_cut_by_max_tokens_is_refused_not_returned(tools_frontend: Served) -> None:
    body = {"model": MODEL, "messages": ASK_ONE, "tools": TOOLS, "max_tokens": 20}
    whole = httpx.post(tools_frontend.url + "/v1/chat/completions", json=body, timeout=30)
    assert whole.status_code == 400 and whole.json()["error"]["code"] == "output_truncated"
    assert whole.json()["error"]["param"] == "max_tokens"
    events = _stream_events(tools_frontend, {**body, "stream": True})
    assert events[-1]["error"]["code"] == "output_truncated"


def _run(stream: ToolStream, pieces: list[str], finish: str) -> ToolDelta:
    total = ToolDelta()
    for piece in pieces:
        total.extend(stream.feed(piece))
    return total.extend(stream.finish(finish))


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def _flat(delta: ToolDelta) -> tuple[str, list[tuple[int, str | None, str]]]:
    calls: dict[int, list[Any]] = {}
    for d in delta.calls:
        calls.setdefault(d.index, [d.name, ""])[1] += d.arguments
    return delta.content, [(i, name, args) for i, (name, args) in sorted(calls.items())]


HERMES_TEXTS = [
    WEATHER_CALL,
    TWO_CALLS,
    "no calls at all, just text  ",
    'a <tool_call>{"arguments": {"k": [1, {"x": "}"}]}, "name": "late"}</tool_call> b\n',
    "a < b and <tool_cal is not a call <tool_call",
]


@settings(max_examples=60)
@given(st.sampled_from(HERMES_TEXTS), st.lists(st.integers(0, 400), max_size=30))
def test_hermes_stream_adds_up_to_the_whole_parse_however_it_is_split(
    text: str, cuts: list[int]
) -> None:
    whole = HermesToolStream()
    whole_delta = _run(whole, [text], "stop")
    split = HermesToolStream()
    split_delta = _run(split, _split(text, cuts), "stop")
    assert _flat(split_delta) == _flat(whole_delta)
    assert [(c.name, c.arguments) for c in split.calls] == [
        (c.name, c.arguments) for c in whole.calls
    ]
    assert split.content == whole.content
    for call in whole.calls:
        json.loads(call.arguments)


def test_hermes_content_and_arguments_are_what_the_model_wrote() -> None:
    stream = HermesToolStream()
    _run(stream, [HERMES_TEXTS[3]], "stop")
    assert stream.content == "a  b"  # the text around the block, less the final newline
    assert [(c.name, c.arguments) for c in stream.calls] == [("late", '{"k": [1, {"x": "}"}]}')]
    plain = HermesToolStream()
    assert _run(plain, [HERMES_TEXTS[4]], "stop").content == HERMES_TEXTS[4]


@settings(max_examples=40)
@given(st.lists(st.integers(0, 200), max_size=20))
def test_required_stream_adds_up_however_it_is_split(cuts: list[int]) -> None:
    text = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]'
    whole = RequiredToolStream()
    split = RequiredToolStream()
    assert _flat(_run(split, _split(text, cuts), "stop")) == _flat(_run(whole, [text], "stop"))
    assert [(c.name, c.arguments) for c in split.calls] == [("a", '{"x": 1}'), ("b", "{}")]


def test_forced_streams_refuse_invalid_and_truncated_json() -> None:
    with pytest.raises(InvalidOutputError):
        _run(NamedToolStream("f"), ['{"a": '], "stop")
    with pytest.raises(TruncatedOutputError):
        _run(NamedToolStream("f"), ['{"a": '], "length")
    with pytest.raises(InvalidOutputError):
        _run(RequiredToolStream(), ["[]"], "stop")
    with pytest.raises(InvalidOutputError):
        _run(HermesToolStream(), ['<tool_call>{"name": "f"}</tool_call>'], "stop")
    with pytest.raises(InvalidOutputError):
        _run(HermesToolStream(), ['<tool_call>{"na\\q": "f"}</tool_call>'], "stop")


def test_each_choice_streams_its_calls_and_keeps_every_token_logprob(
    tools_frontend: Served,
) -> None:
    body = {
        "model": MODEL,
        "messages": ASK_ONE,
        "tools": TOOLS,
        "max_tokens": 200,
        "n": 2,
        "logprobs": True,
    }
    whole = httpx.post(tools_frontend.url + "/v1/chat/completions", json=body, timeout=30).json()
    events = _stream_events(tools_frontend, {**body, "stream": True})
    for index in (0, 1):
        mine = [c for e in events for c in e["choices"] if c["index"] == index]
        arguments = "".join(
            part["function"]["arguments"] for c in mine for part in c["delta"].get("tool_calls", [])
        )
        expected = whole["choices"][index]
        assert arguments == expected["message"]["tool_calls"][0]["function"]["arguments"]
        assert "".join(c["delta"].get("content", "") for c in mine) == "Let me check."
        assert mine[-1]["finish_reason"] == "tool_calls"
        # Chunks whose text is held back still carry their tokens' log-probabilities.
        streamed = [t for c in mine for t in c["logprobs"]["content"]]
        assert len(streamed) == len(expected["logprobs"]["content"])
    assert whole["usage"]["completion_tokens"] == 2 * len(streamed)
