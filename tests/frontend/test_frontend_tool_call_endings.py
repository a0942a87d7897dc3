"""How a model's output may end around its last tool call.

vLLM's hermes parser (``<tool_call>(.*?)</tool_call>|<tool_call>(.*)``) returns a final call
whose JSON is complete even when ``</tool_call>`` never comes: the model stopped right after
the JSON, or a stop sequence took the tag. An unfinished JSON there is still a malformed block.
Unit tests of the parsers, then the frontend in front of a KServe stand-in whose toy model
writes such endings, streamed and not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.frontend.errors import InvalidOutputError, TruncatedOutputError
from runtime.frontend.tool_parsers import HermesToolStream, RequiredToolStream, ToolStream
from tests.frontend.conftest import Served, make_settings, serve
from tests.support.kserve_server import KServeStandIn, StandInModel
from tests.support.toy_model import ToyModel

MODEL = "toy-llm"
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ROME = '{"name": "get_time", "arguments": {"zone": "Europe/Rome"}}'
UNTERMINATED = f"<tool_call>\n{PARIS}"
UNTERMINATED_SECOND = f"<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{ROME}\n"
HALF_CLOSED = f"Let me check. <tool_call>\n{PARIS}\n</tool_"
UNFINISHED = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
ENDED_INSIDE = "the output ended inside a <tool_call> block"

SCRIPTS = (
    (r"Tools: .*unterminated call", UNTERMINATED),
    (r"Tools: .*unfinished call", UNFINISHED),
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _run(stream: ToolStream, pieces: list[str], finish: str) -> tuple[str, list[str]]:
    """Feed ``pieces`` and end the output: the content and each call's streamed arguments."""
    content, arguments = "", dict[int, str]()
    for delta in [*(stream.feed(p) for p in pieces), stream.finish(finish)]:
        content += delta.content
        for call in delta.calls:
            arguments[call.index] = arguments.get(call.index, "") + call.arguments
    return content, [arguments[i] for i in sorted(arguments)]


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (UNTERMINATED, "", [("get_weather", '{"city": "Paris"}')]),
        (UNTERMINATED + " \n", "", [("get_weather", '{"city": "Paris"}')]),
        (
            UNTERMINATED_SECOND,
            "",
            [("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "Europe/Rome"}')],
        ),
        # A stop string within the tag ("call>") leaves the tag's start. vLLM's streaming
        # parser returns this call, its non-streamed one does not; here both must agree, and
        # the stream has sent the call by now.
        (HALF_CLOSED, "Let me check.", [("get_weather", '{"city": "Paris"}')]),
    ],
)
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_a_complete_call_without_its_closing_tag_is_returned(
    text: str, content: str, calls: list[tuple[str, str]], finish: str
) -> None:
    stream = HermesToolStream()
    streamed_content, streamed = _run(stream, [text], finish)
    assert [(c.name, c.arguments) for c in stream.calls] == calls
    assert streamed == [arguments for _, arguments in calls]
    assert streamed_content == content and (stream.content or "") == content


@settings(max_examples=60)
@given(
    st.sampled_from([UNTERMINATED, UNTERMINATED_SECOND, HALF_CLOSED]),
    st.lists(st.integers(0, 200), max_size=30),
)
def test_an_unterminated_call_streams_as_it_parses_whole(text: str, cuts: list[int]) -> None:
    whole, split = HermesToolStream(), HermesToolStream()
    assert _run(split, _split(text, cuts), "stop") == _run(whole, [text], "stop")
    assert [(c.name, c.arguments) for c in split.calls] == [
        (c.name, c.arguments) for c in whole.calls
    ]


@pytest.mark.parametrize(
    "text",
    [
        UNFINISHED,
        "<tool_call>",
        "<tool_call>\n  ",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}',  # no outer brace
        f"<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n" + '{"name": "get_time", ',
    ],
)
def test_an_unfinished_call_at_the_end_is_still_malformed(text: str) -> None:
    with pytest.raises(InvalidOutputError, match=ENDED_INSIDE):
        _run(HermesToolStream(), [text], "stop")
    with pytest.raises(TruncatedOutputError):
        _run(HermesToolStream(), [text], "length")


def test_what_follows_an_unterminated_call_must_be_its_closing_tag() -> None:
    with pytest.raises(InvalidOutputError, match="not followed by </tool_call>"):
        _run(HermesToolStream(), [UNTERMINATED + " done"], "stop")


def test_an_unterminated_call_is_still_checked_against_strict_parameters() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "integer"}}}
    with pytest.raises(InvalidOutputError, match="strict parameters"):
        _run(HermesToolStream({"get_weather": schema}), [UNTERMINATED], "stop")


def test_a_required_list_left_open_is_refused() -> None:
    # vLLM validates the whole list for tool_choice "required" and returns no call from one
    # left open; here the end of that output stays an error.
    with pytest.raises(InvalidOutputError):
        _run(RequiredToolStream(), ['[{"name": "a", "parameters": {}}'], "stop")
    with pytest.raises(TruncatedOutputError):
        _run(RequiredToolStream(), ['[{"name": "a", "parameters": {}}'], "length")


@pytest.fixture(scope="module")
def endings_frontend(tokenizer_dir: Path) -> Iterator[Served]:
    standin = KServeStandIn(
        [StandInModel("llm-tools", ToyModel(scripts=SCRIPTS), max_model_len=512)]
    ).start()
    settings = make_settings(standin, tokenizer_dir, model_name="llm-tools", max_model_len=512)
    served = serve(settings, standin)
    yield served
    served.stop()
    standin.stop()


def _body(ask: str, stream: bool) -> dict[str, Any]:
    messages = [{"role": "user", "content": ask}]
    return {"model": MODEL, "messages": messages, "tools": [WEATHER], "stream": stream}


def _events(served: Served, ask: str) -> list[dict[str, Any]]:
    response = httpx.post(served.url + "/v1/chat/completions", json=_body(ask, True), timeout=30)
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_the_frontend_returns_an_unterminated_call(endings_frontend: Served) -> None:
    ask = "make an unterminated call"
    url = endings_frontend.url + "/v1/chat/completions"
    response = httpx.post(url, json=_body(ask, False), timeout=30)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}

    events = _events(endings_frontend, ask)
    parts = [p for e in events for c in e["choices"] for p in c["delta"].get("tool_calls", [])]
    assert "".join(p["function"]["arguments"] for p in parts) == '{"city": "Paris"}'
    assert [p["function"]["name"] for p in parts if "id" in p] == ["get_weather"]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_frontend_refuses_an_unfinished_call(endings_frontend: Served) -> None:
    ask = "make an unfinished call"
    url = endings_frontend.url + "/v1/chat/completions"
    response = httpx.post(url, json=_body(ask, False), timeout=30)
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_tool_call" and ENDED_INSIDE in error["message"]

    (event,) = [e for e in _events(endings_frontend, ask) if "error" in e]
    assert event["error"]["code"] == "invalid_tool_call"
    assert ENDED_INSIDE in event["error"]["message"]
