"""The KServe v2 stand-in speaks Triton's protocol to tritonclient (sync and asyncio streaming)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from runtime.serving_backend import BACKEND_NAME
from tests.support.kserve_server import (
    HEALTH_CHECK_METHOD,
    HEALTH_SERVING,
    SAMPLING_PARAMETER_KEYS,
    KServeStandIn,
    StandInModel,
)
from tests.support.ports import free_port
from tests.support.toy_model import ToyModel


def _inputs(prompt: str, params: dict, *, stream: bool, mod=grpcclient) -> list:
    text = mod.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    flag = mod.InferInput("stream", [1], "BOOL")
    flag.set_data_from_numpy(np.array([stream]))
    sp = mod.InferInput("sampling_parameters", [1], "BYTES")
    sp.set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=np.object_))
    out = [text, flag, sp]
    for name in ("exclude_input_in_output", "return_finish_reason", "return_num_output_tokens"):
        t = mod.InferInput(name, [1], "BOOL")
        t.set_data_from_numpy(np.array([True]))
        out.append(t)
    return out


@pytest.fixture
def standin():
    server = KServeStandIn(
        [StandInModel("toy"), StandInModel("broken", ToyModel(invalid_json=True))]
    )
    server.start()
    yield server
    server.stop()


def test_health_and_metadata(standin: KServeStandIn) -> None:
    client = grpcclient.InferenceServerClient(standin.url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("toy") and not client.is_model_ready("missing")
    meta = client.get_model_metadata("toy", as_json=True)
    assert {i["name"] for i in meta["inputs"]} >= {"text_input", "sampling_parameters", "stream"}
    assert "text_output" in {o["name"] for o in meta["outputs"]}
    config = client.get_model_config("toy", as_json=True)["config"]
    # Stand-in models default to what the serving image renders: our backend over the stock one.
    assert config["backend"] == BACKEND_NAME and config["model_transaction_policy"]["decoupled"]
    with grpc.insecure_channel(standin.url) as channel:
        reply = channel.unary_unary(HEALTH_CHECK_METHOD)(b"")
    assert reply == HEALTH_SERVING


def test_readiness_turns_true_after_load_time() -> None:
    # An hour: however loaded the machine, it asks before the load time passes (3 s did not
    # always hold). Then the start is moved an hour back: the load time has passed.
    server = KServeStandIn(load_seconds=3600.0).start()
    try:
        client = grpcclient.InferenceServerClient(server.url)
        assert client.is_server_live() and not client.is_server_ready()
        assert not client.is_model_ready("toy")
        server._started_at -= 3600.0
        assert client.is_server_ready() and client.is_model_ready("toy")
    finally:
        server.stop()


def test_sync_infer_is_deterministic_and_honours_parameters(standin: KServeStandIn) -> None:
    client = grpcclient.InferenceServerClient(standin.url)
    params = {"max_tokens": 5, "temperature": 0, "n": 2}
    first = client.infer("toy", _inputs("the cat", params, stream=False))
    second = client.infer("toy", _inputs("the cat", params, stream=False))
    texts = first.as_numpy("text_output")
    assert list(texts) == list(second.as_numpy("text_output")) and len(texts) == 2
    assert all(len(t.split()) == 5 for t in texts)
    assert list(first.as_numpy("finish_reason")) == [b"length", b"length"]
    assert list(first.as_numpy("num_output_tokens")) == [5, 5]
    assert standin.requests[-1].sampling_parameters == params


def test_unknown_sampling_parameter_is_rejected(standin: KServeStandIn) -> None:
    client = grpcclient.InferenceServerClient(standin.url)
    with pytest.raises(InferenceServerException, match="unexpected keyword argument 'bogus'"):
        client.infer("toy", _inputs("the cat", {"bogus": 1}, stream=False))


def test_structured_output_and_invalid_json_fault(standin: KServeStandIn) -> None:
    client = grpcclient.InferenceServerClient(standin.url)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    params = {"structured_outputs": json.dumps({"json": schema})}
    good = client.infer("toy", _inputs("x", params, stream=False)).as_numpy("text_output")[0]
    assert json.loads(good) == {"n": 1}
    bad = client.infer("broken", _inputs("x", params, stream=False)).as_numpy("text_output")[0]
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad)


async def test_aio_stream_infer_yields_deltas_until_finish_reason(standin: KServeStandIn) -> None:
    client = aioclient.InferenceServerClient(standin.url)

    async def requests():
        yield {
            "model_name": "toy",
            "inputs": _inputs("the cat", {"max_tokens": 4}, stream=True, mod=aioclient),
            "request_id": "r1",
        }

    pieces, reasons = [], []
    async for result, error in client.stream_infer(requests()):
        assert error is None
        assert result.get_response().id == "r1"
        pieces.append(result.as_numpy("text_output")[0].decode())
        reasons.append(result.as_numpy("finish_reason")[0].decode())
        if reasons[-1] != "None":
            break
    await client.close()
    assert len(pieces) == 4 and reasons == ["None", "None", "None", "length"]
    whole = grpcclient.InferenceServerClient(standin.url).infer(
        "toy", _inputs("the cat", {"max_tokens": 4}, stream=False)
    )
    assert "".join(pieces) == whole.as_numpy("text_output")[0].decode()


def test_sync_stream_marks_the_final_response(standin: KServeStandIn) -> None:
    client = grpcclient.InferenceServerClient(standin.url)
    finals: list[bool] = []
    client.start_stream(
        callback=lambda result, error: finals.append(
            result.get_response().parameters["triton_final_response"].bool_param
        )
    )
    client.async_stream_infer(
        "toy",
        _inputs("a", {"max_tokens": 3}, stream=True),
        enable_empty_final_response=True,
    )
    client.stop_stream()
    assert finals == [False, False, True]


async def test_stream_rejects_included_input(standin: KServeStandIn) -> None:
    client = aioclient.InferenceServerClient(standin.url)
    inputs = _inputs("x", {}, stream=True, mod=aioclient)
    inputs[3].set_data_from_numpy(np.array([False]))  # exclude_input_in_output

    async def requests():
        yield {"model_name": "toy", "inputs": inputs}

    async for _result, error in client.stream_infer(requests()):
        assert error is not None and "exclude_input_in_output" in str(error)
        break
    await client.close()


def test_sampling_parameter_keys_match_pinned_vllm() -> None:
    from vllm.sampling_params import SamplingParams

    assert set(SamplingParams.__struct_fields__) == SAMPLING_PARAMETER_KEYS - {
        "lora_name",
        "guided_decoding",
    }


def _repository(tmp_path: Path) -> Path:
    model = tmp_path / "repo" / "llm"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'backend: "vllm"\nmodel_transaction_policy { decoupled: true }\n'
    )
    (model / "1" / "model.json").write_text("{}")
    return tmp_path / "repo"


def test_executable_serves_loads_and_stops_on_sigterm(tmp_path: Path) -> None:
    port, http_port = free_port(), free_port()
    cmd = [
        sys.executable,
        "-m",
        "tests.support.kserve_server",
        f"--model-repository={_repository(tmp_path)}",
        f"--grpc-port={port}",
        f"--http-port={http_port}",
        "--metrics-port=0",
        "--model-control-mode=explicit",
        "--load-model=llm",
        "--strict-readiness=true",
        "--log-verbose=1",
    ]
    env = {**os.environ, "KSERVE_STANDIN_LOAD_SECONDS": "0.3"}
    proc = subprocess.Popen(cmd, env=env, cwd=Path(__file__).parents[2])
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        # Generous: a Python start that imports grpc, numpy and tritonclient, on a loaded machine.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if client.is_server_ready():
                    break
            except InferenceServerException:
                pass
            time.sleep(0.1)
        assert client.is_model_ready("llm")
        out = client.infer("llm", _inputs("a", {"max_tokens": 2}, stream=False))
        assert len(out.as_numpy("text_output")[0].split()) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_executable_exits_nonzero_for_missing_model(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.kserve_server",
            f"--model-repository={_repository(tmp_path)}",
            f"--grpc-port={free_port()}",
            "--allow-http=false",
            "--model-control-mode=explicit",
            "--load-model=absent",
        ],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and "absent" in proc.stderr
