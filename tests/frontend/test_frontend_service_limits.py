"""Production behaviour: invalid engine JSON, API keys, size limit, deadline, disconnects,
the open-stream bound, access logs, readiness, and scoring against a stock backend.

API keys, the size limit, truncated JSON, access logs and the frontend-equals-tritonclient check
run in front of real Triton and the real engine. The rest keep the KServe stand-in, each for
what real Triton cannot be made to do on purpose: invalid JSON from the engine, tokens slow
enough for a deadline or a disconnect at a chosen moment, a model that stays loading until the
test says otherwise, a stock-backend model, and the toy's exact prompt log-probabilities.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient

from runtime.frontend.middleware import ACCESS_LOGGER
from tests.frontend.conftest import (
    API_KEY,
    REAL_MODEL,
    Served,
    make_settings,
    serve,
    serve_real,
)
from tests.support.kserve_server import KServeStandIn, StandInModel
from tests.support.ports import free_port
from tests.support.real_triton import TritonServer

MODEL = "toy-llm"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "secret prompt words"}]}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}


@pytest.fixture
def broken(standin: KServeStandIn, tokenizer_dir: Path):
    served = serve(make_settings(standin, tokenizer_dir, model_name="llm-broken"), standin)
    yield served
    served.stop()


def _invalid_count(served: Served) -> float:
    value = served.state.metrics.registry.get_sample_value(
        "llm_serving_frontend_invalid_output_total",
        {"model": MODEL, "route": "/v1/chat/completions"},
    )
    return value or 0.0


def test_invalid_engine_json_is_an_explicit_error_and_counted(broken: Served) -> None:
    client = openai.OpenAI(base_url=f"{broken.url}/v1", api_key="x", max_retries=0)
    before = _invalid_count(broken)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**CHAT, response_format=JSON_FORMAT, max_tokens=20)
    assert info.value.status_code == 502
    assert info.value.body["code"] == "invalid_json_output"
    assert "invalid JSON" in info.value.body["message"]
    assert _invalid_count(broken) == before + 1
    exposition = httpx.get(broken.url + "/metrics").text
    assert f'llm_serving_frontend_invalid_output_total{{model="{MODEL}"' in exposition
    # Plain text from the same engine is returned as it is: only the JSON contract failed.
    plain = client.chat.completions.create(**CHAT, max_tokens=3)
    assert plain.choices[0].message.content


def test_invalid_engine_json_ends_a_stream_with_an_error_event(broken: Served) -> None:
    client = openai.OpenAI(base_url=f"{broken.url}/v1", api_key="x", max_retries=0)
    before = _invalid_count(broken)
    stream = client.chat.completions.create(
        **CHAT, response_format=JSON_FORMAT, max_tokens=20, stream=True
    )
    with pytest.raises(openai.APIError, match="invalid JSON"):
        for _ in stream:
            pass
    assert _invalid_count(broken) == before + 1


def test_stream_of_invalid_json_is_what_fields_md_says(broken: Served) -> None:
    # The invalid text goes out as generated; the chunk that would carry finish_reason is
    # replaced by one error event, and neither usage nor [DONE] follows.
    body = {
        **CHAT,
        "response_format": JSON_FORMAT,
        "max_tokens": 20,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", broken.url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    *chunks, last = [json.loads(e) for e in events]
    assert last == {
        "error": {
            "message": last["error"]["message"],
            "type": "server_error",
            "param": "response_format",
            "code": "invalid_json_output",
        }
    }
    content = "".join(c["delta"].get("content") or "" for e in chunks for c in e["choices"])
    assert content == '{"ok": true'  # the stand-in's invalid JSON, all of it sent
    assert all(c["finish_reason"] is None for e in chunks for c in e["choices"])
    assert all(e.get("usage") is None for e in chunks)


def test_truncated_json_is_refused_not_returned(real_frontend: Served) -> None:
    frontend = real_frontend
    before = _invalid_count(frontend)
    response = httpx.post(
        frontend.url + "/v1/chat/completions",
        json={**CHAT, "response_format": JSON_FORMAT, "max_tokens": 1},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "max_tokens" and error["code"] == "output_truncated"
    assert _invalid_count(frontend) == before + 1


def test_api_keys(real_triton: TritonServer, real_tokenizer_dir: Path, keys_file: Path) -> None:
    served = serve_real(real_triton, real_tokenizer_dir, api_keys_file=keys_file)
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{served.url}/v1", api_key="wrong").models.list()
        response = httpx.get(served.url + "/v1/models")
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
        good = openai.OpenAI(base_url=f"{served.url}/v1", api_key=API_KEY)
        assert good.chat.completions.create(**CHAT, max_tokens=2).choices
        assert httpx.get(served.url + "/health/live").status_code == 200
    finally:
        served.stop()


def test_keys_file_must_hold_hashes(standin, tokenizer_dir: Path, tmp_path: Path) -> None:
    from runtime.frontend import create_app

    plain = tmp_path / "keys"
    plain.write_text(API_KEY + "\n")
    with pytest.raises(ValueError, match="LLM_SERVING_FRONTEND_API_KEYS_FILE"):
        create_app(make_settings(standin, tokenizer_dir, api_keys_file=plain))


def test_request_size_limit(real_triton: TritonServer, real_tokenizer_dir: Path) -> None:
    served = serve_real(real_triton, real_tokenizer_dir, max_request_bytes=2048)
    try:
        big = {**CHAT, "messages": [{"role": "user", "content": "x " * 2000}]}
        response = httpx.post(served.url + "/v1/chat/completions", json=big)
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"

        def chunks():
            yield json.dumps(big).encode()

        chunked = httpx.post(served.url + "/v1/chat/completions", content=chunks())
        assert chunked.status_code == 413
    finally:
        served.stop()


@pytest.fixture
def slow(tokenizer_dir: Path):
    standin = KServeStandIn([StandInModel("llm")], token_delay_s=0.05).start()
    yield standin
    standin.stop()


def test_deadline_is_504(slow: KServeStandIn, tokenizer_dir: Path) -> None:
    # 2 s: a loaded machine still gets the request to Triton before the deadline (with 0.3 s it
    # sometimes did not, and there was nothing to cancel); 5 s of tokens outlast it.
    served = serve(make_settings(slow, tokenizer_dir, request_timeout_s=2.0), slow)
    try:
        body = {**CHAT, "max_tokens": 100}
        response = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 504
        assert response.json()["error"]["code"] == "deadline_exceeded"
        # The whole deadline was spent: the OpenAI SDKs would otherwise retry it twice.
        assert response.headers["x-should-retry"] == "false"
        _wait_for(lambda: slow.in_flight == 0)
        assert slow.cancelled >= 1
    finally:
        served.stop()


def test_stream_deadline_ends_with_an_error_event(slow: KServeStandIn, tokenizer_dir: Path):
    # 2 s leaves a loaded machine time for the first token (every 0.05 s), 5 s of them short.
    served = serve(make_settings(slow, tokenizer_dir, request_timeout_s=2.0), slow)
    try:
        body = {**CHAT, "max_tokens": 100, "stream": True}
        response = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=30)
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert response.status_code == 200 and len(events) >= 2
        assert json.loads(events[-1])["error"]["code"] == "deadline_exceeded"
        _wait_for(lambda: slow.in_flight == 0)
    finally:
        served.stop()


def _wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_client_disconnect_cancels_the_triton_request(
    slow: KServeStandIn, tokenizer_dir: Path
) -> None:
    served = serve(make_settings(slow, tokenizer_dir), slow)
    url = served.url + "/v1/chat/completions"
    try:
        before = slow.cancelled
        body = {**CHAT, "max_tokens": 150, "stream": True}
        with httpx.Client(timeout=10) as client, client.stream("POST", url, json=body) as response:
            lines = response.iter_lines()
            next(lines)  # one token arrived; leaving the block closes the connection
        _wait_for(lambda: slow.cancelled == before + 1 and slow.in_flight == 0)

        # A client that gives up on a non-streamed request once it has reached Triton (a
        # client timeout raced the request there on a loaded machine).
        body = json.dumps({**CHAT, "max_tokens": 150}).encode()
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        port = int(served.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(head.encode() + body)
            _wait_for(lambda: slow.in_flight == 1)
        _wait_for(lambda: slow.cancelled == before + 2 and slow.in_flight == 0)
    finally:
        served.stop()


def test_open_streams_are_bounded_with_429(slow: KServeStandIn, tokenizer_dir: Path) -> None:
    served = serve(make_settings(slow, tokenizer_dir, max_concurrent_streams=1), slow)
    try:
        with httpx.Client(timeout=10) as client:
            # 10 s of tokens: the first stream is still open for both requests below.
            body = {**CHAT, "max_tokens": 200, "stream": True}
            with client.stream("POST", served.url + "/v1/chat/completions", json=body) as first:
                lines = first.iter_lines()  # kept: a dropped iterator closes the response
                next(lines)
                second = client.post(served.url + "/v1/chat/completions", json=body)
                assert second.status_code == 429
                assert second.json()["error"]["type"] == "rate_limit_error"
                # SDKs wait this long before their retry instead of their own backoff.
                assert second.headers["retry-after"] == "1"
                # Non-streamed requests are not counted against the bound.
                assert (
                    client.post(
                        served.url + "/v1/completions",
                        json={"model": MODEL, "prompt": "a", "max_tokens": 1},
                    ).status_code
                    == 200
                )
        _wait_for(lambda: served.state.open_streams == 0)
        assert client_ok(served)
    finally:
        served.stop()


def client_ok(served: Served) -> bool:
    body = {**CHAT, "max_tokens": 2, "stream": True}
    return httpx.post(served.url + "/v1/chat/completions", json=body).status_code == 200


def test_access_log_is_structured_and_has_no_prompt(
    real_frontend: Served, caplog: pytest.LogCaptureFixture
) -> None:
    frontend = real_frontend

    def records() -> list[dict]:
        return [json.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOGGER]

    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        response = httpx.post(frontend.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 2})
        # The server thread writes the line once the response is sent, maybe after the client
        # has read it.
        _wait_for(lambda: bool(records()))
    last = records()[-1]
    assert last["status"] == 200
    assert last["path"] == "/v1/chat/completions"
    assert last["request_id"] == response.headers["x-request-id"]
    assert all("secret" not in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("3f6c1a9e-0b7d-4e21-9a55-2c1d8e7f0a11", True),
        ("trace.42:a_b", True),
        ("a b", False),
        ("x" * 129, False),
    ],
)
def test_a_plain_request_id_from_the_caller_is_kept(
    frontend: Served, caplog: pytest.LogCaptureFixture, sent: str, kept: bool
) -> None:
    def records() -> list[dict]:
        return [json.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOGGER]

    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        response = httpx.get(frontend.url + "/v1/models", headers={"x-request-id": sent})
        _wait_for(lambda: bool(records()))
    echoed = response.headers["x-request-id"]
    assert (echoed == sent) is kept
    assert records()[-1]["request_id"] == echoed


def test_readiness_follows_triton(tokenizer_dir: Path) -> None:
    # Loading until the test says otherwise: a fixed load time raced the frontend's start.
    loading = KServeStandIn([StandInModel("llm")], load_seconds=float("inf")).start()
    served = serve(make_settings(loading, tokenizer_dir), loading)
    try:
        assert httpx.get(served.url + "/health/live").status_code == 200
        assert httpx.get(served.url + "/health/ready").status_code == 503
        loading.load_seconds = 0.0
        _wait_for(lambda: httpx.get(served.url + "/health/ready").status_code == 200)
    finally:
        served.stop()
        loading.stop()


def test_unreachable_triton_is_503_and_not_ready(tokenizer_dir: Path) -> None:
    gone = KServeStandIn([StandInModel("llm")]).start()
    gone.stop()  # its port is now closed
    served = serve(make_settings(gone, tokenizer_dir), gone)
    try:
        response = httpx.post(served.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 2})
        assert response.status_code == 503
        assert "Triton" in response.json()["error"]["message"]
        assert response.headers["retry-after"] == "1"
        assert httpx.get(served.url + "/health/ready").status_code == 503
    finally:
        served.stop()


def test_scoring_is_refused_against_a_backend_without_prompt_logprobs(
    standin: KServeStandIn, tokenizer_dir: Path
) -> None:
    served = serve(make_settings(standin, tokenizer_dir, model_name="llm-stock"), standin)
    try:
        body = {"model": MODEL, "prompt": "the", "candidates": [" cat"]}
        response = httpx.post(served.url + "/v1/score", json=body)
        assert response.status_code == 501
        assert response.json()["error"]["code"] == "scoring_unsupported"
        assert response.headers["x-should-retry"] == "false"
    finally:
        served.stop()


@pytest.mark.parametrize(
    ("field", "value", "extra", "streams"),
    [
        # The stock backend fails every logit_bias request (real Triton shows it:
        # tests/serving_backend/test_real_triton_stock_backend.py); say so before sending one.
        ("logit_bias", {"3": 5}, {}, (False, True)),
        # It streams vLLM's cumulative outputs, which vLLM 0.27.1 never batches.
        ("stream_interval", 4, {}, (False, True)),
        # It has no prompt_logprobs output.
        ("echo", True, {"logprobs": 1}, (False, True)),
        ("prompt_logprobs", 1, {}, (False,)),  # never streamed
        # It reads no request parameters beside the sampling_parameters tensor.
        ("cache_salt", "tenant-a", {}, (False, True)),
    ],
)
def test_fields_the_stock_backend_cannot_honour_are_refused(
    standin: KServeStandIn,
    tokenizer_dir: Path,
    field: str,
    value: Any,
    extra: dict[str, Any],
    streams: tuple[bool, ...],
) -> None:
    served = serve(make_settings(standin, tokenizer_dir, model_name="llm-stock"), standin)
    try:
        sent = len(standin.requests)
        for stream in streams:
            body = {"model": MODEL, "prompt": "the", field: value, "stream": stream, **extra}
            response = httpx.post(served.url + "/v1/completions", json=body)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == field and "llm_serving_vllm" in error["message"]
        assert len(standin.requests) == sent
        plain = {"model": MODEL, "prompt": "the", "max_tokens": 2}
        assert httpx.post(served.url + "/v1/completions", json=plain).status_code == 200
    finally:
        served.stop()


def test_echo_logprobs_are_the_models_prompt_logprobs(frontend: Served) -> None:
    body = {"model": MODEL, "prompt": "the cat", "echo": True, "logprobs": 1, "max_tokens": 0}
    choice = httpx.post(frontend.url + "/v1/completions", json=body).json()["choices"][0]
    rows = frontend.standin.models["llm"].toy.prompt_logprobs("the cat")
    assert choice["text"] == "the cat"
    assert choice["logprobs"]["token_logprobs"] == [
        None,
        *(pytest.approx(next(iter(r.values()))) for r in rows[1:]),
    ]


def test_scores_match_the_models_prompt_logprobs(frontend: Served) -> None:
    body = {"model": MODEL, "prompt": "the cat", "candidates": [" sat on", " ran"]}
    data = httpx.post(frontend.url + "/v1/score", json=body).json()["data"]
    toy = frontend.standin.models["llm"].toy
    for item in data:
        rows = toy.prompt_logprobs("the cat" + item["candidate"])[2:]
        assert item["logprob"] == pytest.approx(sum(next(iter(r.values())) for r in rows))


def test_a_candidate_that_overflows_the_context_is_named(frontend: Served) -> None:
    body = {"model": MODEL, "prompt": "the cat", "candidates": [" sat", " the" * 300]}
    response = httpx.post(frontend.url + "/v1/score", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("candidates[1]", "context_length_exceeded")
    assert "send a shorter prompt" in error["message"]


def test_frontend_text_equals_a_direct_tritonclient_call(
    real_frontend: Served, real_triton: TritonServer
) -> None:
    reply = openai.OpenAI(base_url=f"{real_frontend.url}/v1", api_key="x").completions.create(
        model=MODEL, prompt="the sky", max_tokens=6, temperature=0
    )
    client = grpcclient.InferenceServerClient(real_triton.ports.grpc_url)
    inputs = []
    for name, value, dtype in (
        ("text_input", b"the sky", "BYTES"),
        ("sampling_parameters", json.dumps({"max_tokens": 6, "temperature": 0}).encode(), "BYTES"),
        ("exclude_input_in_output", True, "BOOL"),
    ):
        tensor = grpcclient.InferInput(name, [1], dtype)
        tensor.set_data_from_numpy(
            np.array([value], dtype=np.object_ if dtype == "BYTES" else bool)
        )
        inputs.append(tensor)
    # The vLLM backend is decoupled: Triton answers it on the stream RPC only.
    responses: queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(REAL_MODEL, inputs, enable_empty_final_response=True)
        texts = []
        while True:
            result, error = responses.get(timeout=120)
            assert error is None and result is not None, error
            output = result.as_numpy("text_output")
            if output is not None:
                texts.append(output[0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
    assert texts and reply.choices[0].text == "".join(texts)


def test_module_entry_point_serves_and_reports_bad_settings(
    standin: KServeStandIn, tokenizer_dir: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "LLM_SERVING_FRONTEND_TRITON_URL": standin.url,
        "LLM_SERVING_FRONTEND_MODEL_NAME": "llm",
        "LLM_SERVING_FRONTEND_TOKENIZER_DIR": str(tokenizer_dir),
        "LLM_SERVING_FRONTEND_STRUCTURED_OUTPUTS_KEY": "structured_outputs",
        "LLM_SERVING_FRONTEND_HOST": "127.0.0.1",
        "LLM_SERVING_FRONTEND_PORT": str(port),
        "LLM_SERVING_FRONTEND_MAX_MODEL_LEN": "2048",
    }
    root = Path(__file__).parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "runtime.frontend"], env=env, cwd=root)
    try:
        _wait_for(lambda: proc.poll() is not None or _ready(port), timeout=30)
        assert proc.poll() is None, f"the frontend exited {proc.returncode}"
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
        assert models["data"][0]["id"] == "llm"
    finally:
        proc.terminate()
        proc.wait(10)
    env.pop("LLM_SERVING_FRONTEND_TOKENIZER_DIR")
    bad = subprocess.run(
        [sys.executable, "-m", "runtime.frontend"],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "LLM_SERVING_FRONTEND_TOKENIZER_DIR" in bad.stderr


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health/ready").status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def capped(standin: KServeStandIn, tokenizer_dir: Path):
    served = serve(make_settings(standin, tokenizer_dir, max_logprobs=2), standin)
    yield served
    served.stop()


@pytest.mark.parametrize(
    ("route", "fields", "param"),
    [
        ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 3}, "top_logprobs"),
        ("/v1/completions", {"model": MODEL, "prompt": "a", "logprobs": 3}, "logprobs"),
    ],
)
def test_logprobs_above_the_engines_max_logprobs_are_refused_by_name(
    capped: Served, route: str, fields: dict[str, object], param: str
) -> None:
    # vLLM would refuse the request too, which the stock backend turns into a 502.
    sent = len(capped.requests)
    response = httpx.post(capped.url + route, json={**fields, "max_tokens": 2})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert "max_logprobs 2" in error["message"] and "send at most 2" in error["message"]
    assert len(capped.requests) == sent
    allowed = httpx.post(capped.url + route, json={**fields, param: 2, "max_tokens": 2})
    assert allowed.status_code == 200, allowed.text
    assert capped.requests[-1].sampling_parameters["logprobs"] == 2


@pytest.mark.parametrize(
    ("fixture", "route", "body", "named"),
    [
        ("real_frontend", "/v1/embeddings", {"input": "the cat"}, "/v1/embeddings"),
        ("real_embed_frontend", "/v1/completions", {"prompt": "the cat"}, "chat and text"),
    ],
)
def test_a_route_the_models_task_cannot_answer_is_a_501(
    request: pytest.FixtureRequest, fixture: str, route: str, body: dict[str, Any], named: str
) -> None:
    served: Served = request.getfixturevalue(fixture)
    response = httpx.post(served.url + route, json={"model": MODEL, **body}, timeout=60)
    assert response.status_code == 501, response.text
    assert response.headers["x-should-retry"] == "false"
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("model", "model_not_supported")
    assert f"does not serve {named}" in error["message"]
