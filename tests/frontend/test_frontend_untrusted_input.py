"""Client input that once crashed a route or reached the network: each is a 400 naming its field.

Real sockets throughout: the frontend under uvicorn in front of real Triton and the real engine
(the requests that pass reach them), and a real HTTP listener that records every request a
schema's ``$ref`` could make the pod send.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.frontend.chat_template import ChatTemplate, ChatTemplateError
from runtime.frontend.errors import InvalidRequestError
from runtime.frontend.schemas import _has_lone_surrogate
from runtime.frontend.structured import MAX_JSON_DEPTH, MAX_SCHEMA_DEPTH, JsonRequirement
from tests.frontend.conftest import REAL_MODEL, Served, serve_real
from tests.support.real_triton import TritonServer

MODEL = "toy-llm"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
SCHEMA_PARAM = "response_format.json_schema.schema"
# Qwen2.5/Hermes-style: replayed tool calls rendered with |tojson.
TOOL_CALL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{% if message.tool_calls %}{% for tool_call in message.tool_calls %}"
    "{% if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}"
    '<tool_call>\n{"name": "{{ tool_call.name }}", "arguments": '
    "{{ tool_call.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class _Recorder(http.server.BaseHTTPRequestHandler):
    paths: list[str]

    def do_GET(self) -> None:
        self.paths.append(self.path)
        body = json.dumps({"type": "object", "required": ["secret-from-internal-service"]})
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def frontend(real_frontend: Served) -> Served:
    return real_frontend


@pytest.fixture
def internal_service() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server standing in for a service only the pod can reach; yields (url, paths)."""
    paths: list[str] = []
    handler = type("Recorder", (_Recorder,), {"paths": paths})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", paths
    server.shutdown()
    server.server_close()
    thread.join(10)


def _post(served: Served, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(served.url + route, json=body, timeout=30)


def _refused(response: httpx.Response, param: str | None) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["param"] == param, error
    return error


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.mark.parametrize("where", ["$ref", "if"])
def test_a_remote_ref_is_refused_and_never_fetched(
    frontend: Served, internal_service: tuple[str, list[str]], where: str
) -> None:
    url, paths = internal_service
    ref = {"$ref": f"{url}/latest/meta-data/iam"}
    schema = ref if where == "$ref" else {"if": ref, "then": {"type": "object"}}
    for stream in (False, True):
        body = {**CHAT, "stream": stream, "response_format": _json_schema(schema)}
        error = _refused(_post(frontend, "/v1/chat/completions", body), SCHEMA_PARAM)
        assert "never fetched" in error["message"]
        assert "secret" not in error["message"]
    assert paths == []


def test_an_unresolvable_local_ref_is_a_400_streamed_or_not(frontend: Served) -> None:
    for stream in (False, True):
        body = {**CHAT, "stream": stream, "response_format": _json_schema({"$ref": "#/nope"})}
        error = _refused(_post(frontend, "/v1/chat/completions", body), SCHEMA_PARAM)
        assert "'#/nope'" in error["message"]


def test_a_pattern_the_engine_cannot_compile_is_a_400_streamed_or_not(frontend: Served) -> None:
    # Python's re takes look-behind, so the schema passes the frontend's own check; vLLM's
    # grammar engines refuse it, which reached the client as a 502 without a reason.
    pattern = {"type": "string", "pattern": "(?<=a)b"}
    schema = {"type": "object", "properties": {"a": pattern}, "required": ["a"]}
    for stream in (False, True):
        body = {**CHAT, "stream": stream, "response_format": _json_schema(schema)}
        error = _refused(_post(frontend, "/v1/chat/completions", body), None)
        assert error["code"] == "engine_refused" and "(?<=a)b" in error["message"], error


def test_output_validation_fetches_nothing_either(internal_service: tuple[str, list[str]]) -> None:
    # The request-time check resolves every reference; the validator itself must still refuse
    # to fetch, with an error that ends a stream as other request errors do.
    url, paths = internal_service
    requirement = JsonRequirement({"$ref": f"{url}/x"})
    with pytest.raises(InvalidRequestError) as info:
        requirement.validate("{}", index=0, finish_reason="stop")
    assert info.value.param == SCHEMA_PARAM
    assert paths == []


def test_local_and_recursive_refs_still_validate(frontend: Served) -> None:
    # Recursive through $ref; maxItems 0 bounds what a random-weight model can write.
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 0}
                },
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    response = _post(
        frontend,
        "/v1/chat/completions",
        {**CHAT, "max_tokens": 30, "response_format": _json_schema(tree)},
    )
    assert response.status_code == 200, response.text
    # The engine decoded under the schema, and the frontend checked the result against it.
    assert json.loads(response.json()["choices"][0]["message"]["content"]) in ({}, {"kids": []})


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _items(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def _ref_chain(length: int) -> dict[str, Any]:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(length)}
    defs[f"d{length}"] = {"type": "object"}
    # Listed last to first, so a walk that visits $defs in order meets the chain's end first.
    return {"$ref": "#/$defs/d0", "$defs": dict(reversed(defs.items()))}


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"$schema": 5}, "$schema"),
        (_nested(300), f"{MAX_JSON_DEPTH} levels"),
        # Just within the JSON bound: the metaschema check runs to its end inside the route.
        (_items(MAX_JSON_DEPTH - 1), f"{MAX_SCHEMA_DEPTH} levels"),
        (_ref_chain(MAX_SCHEMA_DEPTH + 8), f"{MAX_SCHEMA_DEPTH} levels"),
        ({"type": 5}, "not a valid JSON Schema"),
    ],
    ids=["schema-not-a-string", "nested-300", "items-63", "ref-chain", "invalid"],
)
def test_schemas_the_validator_cannot_take_are_400s(
    frontend: Served, schema: dict[str, Any], words: str
) -> None:
    body = {**CHAT, "response_format": _json_schema(schema)}
    error = _refused(_post(frontend, "/v1/chat/completions", body), SCHEMA_PARAM)
    assert words in error["message"]


def test_tool_parameters_are_checked_like_response_format(frontend: Served) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nope"}}}
    body = {**CHAT, "tools": [tool]}
    _refused(_post(frontend, "/v1/chat/completions", body), "tools[0].function.parameters")


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": "\ud800"}]},
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            {
                **CHAT,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}],
            },
            "messages.0.content.0.text",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "a \udfff", "max_tokens": 2}, "prompt"),
        ("/v1/embeddings", {"model": MODEL, "input": ["the", "\ud800"]}, "input"),
        ("/v1/score", {"model": MODEL, "prompt": "the", "candidates": [" \ud800"]}, "candidates"),
        ("/v1/chat/completions", {**CHAT, "stop": ["\ud800"]}, "stop"),
        ("/v1/chat/completions", {**CHAT, "metadata": {"\ud800": "x"}}, "metadata"),
        (
            "/v1/chat/completions",
            {**CHAT, "constraints": {"version": 1, "item_list": {"items": ["a", "b\udfff"]}}},
            "constraints",
        ),
    ],
    ids=[
        "chat",
        "chat-part",
        "completions",
        "embeddings",
        "score",
        "stop",
        "dict-key",
        "constraints",
    ],
)
def test_lone_surrogates_are_400s_naming_the_field(
    frontend: Served, route: str, body: dict[str, Any], param: str
) -> None:
    # httpx would refuse to encode a lone surrogate; json.dumps escapes it as JSON allows.
    content = json.dumps(body).encode()
    response = httpx.post(
        frontend.url + route,
        content=content,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    error = _refused(response, param)
    assert "surrogate" in error["message"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([2**70, {"k": "ok"}], False),  # past orjson's 64-bit ints: the walk decides
        ([2**70, {"k": "b\ud800"}], True),
        ({"\udc00": 1}, True),
        ({"rows": [[0, 1, 2]] * 1000, "text": "a\u00e9\U0001f600"}, False),
    ],
)
def test_surrogate_check_on_values_orjson_cannot_encode(value: Any, expected: bool) -> None:
    assert _has_lone_surrogate(value) is expected


def test_logit_bias_keys_must_be_ascii_digits(frontend: Served) -> None:
    for key in ("²", "٣"):
        body = {**CHAT, "logit_bias": {key: 5}}
        _refused(_post(frontend, "/v1/chat/completions", body), "logit_bias")


def test_named_tool_choice_is_typed(frontend: Served) -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    for choice in ({"type": "function", "function": "f"}, {"type": "function"}, "any"):
        body = {**CHAT, "tools": tools, "tool_choice": choice}
        error = _refused(_post(frontend, "/v1/chat/completions", body), "tool_choice")
        assert '"required"' in error["message"]


def test_malformed_json_names_no_field(frontend: Served) -> None:
    response = httpx.post(
        frontend.url + "/v1/chat/completions",
        content=b'{"model":"toy-llm",',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    error = _refused(response, None)
    assert error["message"].startswith("request body is not valid JSON")
    assert "at character 19" in error["message"]


def test_chat_context_overflow_names_messages(frontend: Served) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "the " * 600}]}
    error = _refused(_post(frontend, "/v1/chat/completions", body), "messages")
    assert error["code"] == "context_length_exceeded"


@pytest.fixture(scope="module")
def tool_call_template_frontend(
    real_triton: TritonServer, real_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    # The tiny Llama's tokenizer with a template that renders replayed tool calls.
    directory = tmp_path_factory.mktemp("qwen")
    for name in ("tokenizer.json", "config.json"):
        (directory / name).write_bytes((real_tokenizer_dir / name).read_bytes())
    config = json.loads((real_tokenizer_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = TOOL_CALL_TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    served = serve_real(real_triton, directory, REAL_MODEL)
    yield served
    served.stop()


def _replay(call: dict[str, Any]) -> dict[str, Any]:
    return {
        **CHAT,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
    }


def test_replayed_tool_calls_are_validated(tool_call_template_frontend: Served) -> None:
    served = tool_call_template_frontend
    call = {"id": "c1", "type": "function", "function": {"name": "f"}}
    _refused(
        _post(served, "/v1/chat/completions", _replay(call)),
        "messages.1.tool_calls.0.function.arguments",
    )
    call["function"] = {"name": "f", "arguments": '{"a": 1}'}
    response = _post(served, "/v1/chat/completions", _replay(call))
    assert response.status_code == 200, response.text
    # Parsed before rendering, as vLLM's chat_utils does: the template's tojson writes an
    # object, not the JSON text quoted again.
    assert '"arguments": {"a": 1}' in served.requests[-1].text_input


def test_any_template_failure_is_a_chat_template_error() -> None:
    template = ChatTemplate(TOOL_CALL_TEMPLATE, "", "")
    # What a message without arguments gives the template (tojson on an Undefined).
    messages = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}]
    with pytest.raises(ChatTemplateError, match="TypeError"):
        template.render(messages)
