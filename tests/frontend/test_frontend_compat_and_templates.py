"""The structured-output key comes from the pinned pair; chat templates from tokenizer files;
the hermes tool-call parser.

On the KServe stand-in: the keys of other pairs' vLLM releases are what is checked, and the
real engine (vLLM 0.27.1) would refuse all but its own; the parser needs scripted tool calls.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from runtime.compat import CompatError, load_matrix
from runtime.frontend import create_app
from runtime.frontend.app import structured_outputs_key
from runtime.frontend.chat_template import ChatTemplate, ChatTemplateError
from runtime.frontend.errors import InvalidOutputError
from runtime.frontend.tool_parsers import HermesToolStream
from runtime.frontend.tools import ToolCall
from tests.frontend.conftest import make_settings, serve, write_tokenizer
from tests.support.kserve_server import KServeStandIn

MODEL = "toy-llm"


def test_key_defaults_to_the_matrix_default_pair(standin, tokenizer_dir: Path) -> None:
    settings = make_settings(standin, tokenizer_dir, structured_outputs_key=None)
    assert structured_outputs_key(settings) == load_matrix().default.structured_outputs_key


@pytest.mark.parametrize("release", ["25.10", "26.08"])
def test_pinned_release_selects_the_key_end_to_end(
    standin: KServeStandIn, tokenizer_dir: Path, release: str
) -> None:
    expected = load_matrix().for_triton(release).structured_outputs_key
    settings = make_settings(
        standin, tokenizer_dir, structured_outputs_key=None, triton_release=release
    )
    served = serve(settings, standin)
    try:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object"},
            "max_tokens": 10,
        }
        response = httpx.post(served.url + "/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        sent = standin.requests[-1].sampling_parameters
        assert json.loads(sent[expected]) == {"json_object": True}
        assert ({"guided_decoding", "structured_outputs"} - {expected}) & set(sent) == set()
    finally:
        served.stop()


def test_unknown_release_stops_start_up(standin, tokenizer_dir: Path) -> None:
    settings = make_settings(
        standin, tokenizer_dir, structured_outputs_key=None, triton_release="19.01"
    )
    with pytest.raises(CompatError):
        create_app(settings)


def test_named_template_list_and_missing_template(tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ 1 }}"}]
    write_tokenizer(tmp_path / "a")
    config = tmp_path / "a" / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": named, "bos_token": {"content": "<s>"}}))
    template = ChatTemplate.from_tokenizer_dir(tmp_path / "a")
    assert template.render([]) == "D1" and template.bos_token == "<s>"
    config.write_text(json.dumps({"bos_token": "<s>"}))
    with pytest.raises(ChatTemplateError, match="no chat_template"):
        ChatTemplate.from_tokenizer_dir(tmp_path / "a")


def test_template_raise_exception_is_a_400(standin: KServeStandIn, tmp_path: Path) -> None:
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    served = serve(make_settings(standin, write_tokenizer(tmp_path, strict)), standin)
    try:
        body = {"model": MODEL, "messages": [{"role": "system", "content": "x"}]}
        response = httpx.post(served.url + "/v1/chat/completions", json=body)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "messages"
        assert "user first" in response.json()["error"]["message"]
    finally:
        served.stop()


def parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    parser = HermesToolStream()
    parser.feed(text)
    parser.finish("stop")
    return parser.content, parser.calls


def test_hermes_parser() -> None:
    text = 'ok <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    content, calls = parse_hermes(text + '<tool_call>{"name": "g", "arguments": {}}</tool_call>')
    assert content == "ok"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1}), ("g", {})]
    assert parse_hermes("plain") == ("plain", [])
    with pytest.raises(InvalidOutputError):
        parse_hermes("<tool_call>{not json}</tool_call>")
