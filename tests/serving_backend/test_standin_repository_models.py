"""The KServe stand-in executes non-LLM repository models for real (XGBoost, LightGBM, ONNX,
TorchScript, ensembles) with dynamic batching, and one client calls them and the LLM that real
Triton serves on the real vLLM engine alike."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import lightgbm
import numpy as np
import onnxruntime
import pytest
import torch
import tritonclient.grpc as grpcclient
import xgboost
from transformers import AutoModelForCausalLM, AutoTokenizer
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.support.kserve_server import KServeStandIn, load_models
from tests.support.ports import free_port
from tests.support.real_triton import REAL_MODEL, TritonServer
from tests.support.repository_models import ModelLoadError, ModelRepository, read_config
from tests.support.tabular_models import (
    FEATURES,
    Batching,
    EnsembleStep,
    ensemble_model,
    features,
    lightgbm_model,
    onnx_scaler,
    torchscript_model,
    write_config,
    xgboost_model,
)
from tests.support.tiny_llm import TinyLlm

BATCHED = Batching(max_batch_size=16, dynamic=True, max_queue_delay_us=100_000)


@dataclass(frozen=True)
class Served:
    """The repository on disk, the libraries' own models, and the stand-in serving them."""

    repository: Path
    xgb: xgboost.Booster
    lgbm: lightgbm.Booster
    scaler: tuple[np.ndarray, np.ndarray]
    torchscript: torch.jit.ScriptModule
    server: KServeStandIn
    executed: ModelRepository


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    repo = tmp_path_factory.mktemp("repository")
    xgb = xgboost_model(repo, "xgb_proba", batching=BATCHED)
    xgboost_model(repo, "xgb_class", predict_proba=False, model_type="xgboost_ubj")
    lgbm = lightgbm_model(repo, "lgbm")
    scaler = onnx_scaler(repo, "scaler")
    module = torchscript_model(repo, "ts_indexed")
    torchscript_model(repo, "ts_named", indexed_names=False)
    ensemble_model(
        repo,
        "scaled_xgb",
        [
            EnsembleStep("scaler", {"features": "raw"}, {"scaled": "scaled"}),
            EnsembleStep("xgb_class", {"input__0": "scaled"}, {"output__0": "label"}),
        ],
        inputs=[("raw", [FEATURES])],
        outputs=[("label", [1])],
    )
    models, executed = load_models([repo], [], "none")
    server = KServeStandIn(models, repository=executed).start()
    try:
        yield Served(repo, xgb, lgbm, scaler, module, server, executed)
    finally:
        server.stop()


@pytest.fixture
def client(served: Served) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(served.server.url)


def _inputs(tensors: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    out = []
    for name, value in tensors.items():
        tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        out.append(tensor)
    return out


def infer(
    client: grpcclient.InferenceServerClient, model: str, tensors: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """One request through the one client path for every model: ModelStreamInfer, the RPC real
    Triton accepts for decoupled models (the vLLM backend) and the others alike."""
    results: queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, _inputs(tensors))
        result, error = results.get(timeout=60)
    finally:
        client.stop_stream()
    if error is not None:
        raise error
    assert result is not None
    return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}


def _unary(client: grpcclient.InferenceServerClient, model: str, x: np.ndarray) -> np.ndarray:
    return client.infer(model, _inputs({"input__0": x})).as_numpy("output__0")


def _proba(booster: xgboost.Booster, x: np.ndarray) -> np.ndarray:
    p = booster.predict(xgboost.DMatrix(x))
    return np.stack([1 - p, p], axis=1)


def test_one_client_calls_trees_onnx_and_an_llm(
    served: Served, client, real_triton: TritonServer, tiny_llm: TinyLlm
) -> None:
    x = features(16, seed=10)
    np.testing.assert_allclose(
        infer(client, "xgb_proba", {"input__0": x})["output__0"], _proba(served.xgb, x), rtol=1e-5
    )
    session = onnxruntime.InferenceSession(str(served.repository / "scaler" / "1" / "model.onnx"))
    np.testing.assert_allclose(
        infer(client, "scaler", {"features": x})["scaled"],
        session.run(["scaled"], {"features": x})[0],
        rtol=1e-6,
    )
    prompt, max_tokens = "the cat sat", 4
    llm = infer(
        grpcclient.InferenceServerClient(real_triton.ports.grpc_url),
        REAL_MODEL,
        {
            "text_input": np.array([prompt.encode()], dtype=np.object_),
            "sampling_parameters": np.array(
                [json.dumps({"max_tokens": max_tokens, "temperature": 0}).encode()],
                dtype=np.object_,
            ),
            "exclude_input_in_output": np.array([True]),
            "stream": np.array([False]),
        },
    )
    # The same weights in float32 through transformers, greedy: the library's own prediction.
    tokenizer = AutoTokenizer.from_pretrained(tiny_llm.path)
    model = AutoModelForCausalLM.from_pretrained(tiny_llm.path, torch_dtype=torch.float32)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        greedy = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
    expected = tokenizer.decode(greedy[0, ids.shape[1] :], skip_special_tokens=True)
    assert llm["text_output"][0].decode() == expected


def test_fil_outputs_match_the_libraries(served: Served, client) -> None:
    x = features(16, seed=11)
    p = served.xgb.predict(xgboost.DMatrix(x))
    np.testing.assert_allclose(_unary(client, "xgb_proba", x), _proba(served.xgb, x), rtol=1e-5)
    # xgb_class is another booster (same data and seed: xgboost training is deterministic).
    assert _unary(client, "xgb_class", x).shape == (16, 1)
    np.testing.assert_array_equal(_unary(client, "xgb_class", x)[:, 0], (p > 0.5).astype("f4"))
    np.testing.assert_allclose(
        _unary(client, "lgbm", x)[:, 0], served.lgbm.predict(x), rtol=1e-5, atol=1e-6
    )


def test_torchscript_and_ensemble_match_the_libraries(served: Served, client) -> None:
    x, bias = features(8, seed=12), np.full((8, 3), 0.25, np.float32)
    logits, probabilities = (
        t.detach().numpy() for t in served.torchscript(torch.tensor(x), torch.tensor(bias))
    )
    indexed = client.infer("ts_indexed", _inputs({"INPUT__0": x, "INPUT__1": bias}))
    np.testing.assert_allclose(indexed.as_numpy("OUTPUT__0"), logits, rtol=1e-5)
    np.testing.assert_allclose(indexed.as_numpy("OUTPUT__1"), probabilities, rtol=1e-5)
    named = client.infer("ts_named", _inputs({"x": x, "bias": bias}))
    np.testing.assert_allclose(named.as_numpy("OUTPUT__0"), logits, rtol=1e-5)

    mean, scale = served.scaler
    label = client.infer("scaled_xgb", _inputs({"raw": x})).as_numpy("label")
    expected = served.xgb.predict(xgboost.DMatrix((x - mean) / scale)) > 0.5
    np.testing.assert_array_equal(label[:, 0], expected.astype("f4"))


def test_metadata_and_config_come_from_config_pbtxt(served: Served, client) -> None:
    assert client.is_model_ready("xgb_proba") and client.is_model_ready("scaled_xgb")
    meta = client.get_model_metadata("xgb_proba", as_json=True)
    assert meta["platform"] == "fil" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "input__0", "datatype": "FP32", "shape": ["-1", "4"]}]
    assert client.get_model_metadata("ts_named").platform == "pytorch_libtorch"
    for name in ("xgb_proba", "scaled_xgb", "ts_named"):
        assert client.get_model_config(name).config == read_config(served.repository / name)


def test_dynamic_batching_gathers_concurrent_requests(served: Served) -> None:
    rows = features(16, seed=13)

    def one(model: str, i: int) -> np.ndarray:
        local = grpcclient.InferenceServerClient(served.server.url)
        return _unary(local, model, rows[i : i + 1])

    for model, batched in (("xgb_proba", True), ("xgb_class", False)):
        scheduler = served.executed.models[model].scheduler
        assert scheduler is not None
        scheduler.batch_sizes.clear()
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda i, m=model: one(m, i), range(16)))
        assert sum(scheduler.batch_sizes) == 16
        if batched:
            assert max(scheduler.batch_sizes) > 1, scheduler.batch_sizes
            # Each request got its own rows back from the shared execution.
            np.testing.assert_allclose(np.vstack(answers), _proba(served.xgb, rows), rtol=1e-5)
        else:
            assert scheduler.batch_sizes == [1] * 16


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"input_0": features(1)}, "unexpected inference input 'input_0' for model 'xgb_proba'"),
        (
            {"input__0": features(1).astype(np.float64)},
            "inference input 'input__0' data-type is 'FP64', but model 'xgb_proba' expects 'FP32'",
        ),
        (
            {"input__0": features(2, columns=5)},
            "unexpected shape for input 'input__0' for model 'xgb_proba'. Expected [-1,4], "
            "got [2,5]",
        ),
        (
            {"input__0": features(17)},
            "inference request batch-size must be <= 16 for 'xgb_proba'",
        ),
    ],
)
def test_bad_input_is_invalid_argument(
    client, tensors: dict[str, np.ndarray], message: str
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.infer("xgb_proba", _inputs(tensors))
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert caught.value.message() == f"[request id: <id_unknown>] {message}"


def test_load_errors_name_the_model_and_the_fix(tmp_path: Path) -> None:
    xgboost_model(tmp_path, "wrong_type")
    config = read_config(tmp_path / "wrong_type")
    config.parameters["model_type"].string_value = "catboost"
    write_config(tmp_path, config)
    with pytest.raises(ModelLoadError, match="'wrong_type': unknown model_type 'catboost'; "):
        ModelRepository().load(tmp_path / "wrong_type")
    xgboost_model(tmp_path, "wrong_width", columns=6)
    config = read_config(tmp_path / "wrong_width")
    config.input[0].dims[:] = [FEATURES]
    write_config(tmp_path, config)
    with pytest.raises(ModelLoadError, match=r"xgboost\.json has 6 features but input__0 dims"):
        ModelRepository().load(tmp_path / "wrong_width")


def test_command_line_loads_an_ensemble_and_its_steps(served: Served) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.kserve_server",
            f"--model-repository={served.repository}",
            f"--grpc-port={port}",
            f"--http-port={free_port()}",
            "--model-control-mode=explicit",
            "--load-model=scaled_xgb",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.is_server_ready():
                    break
            except InferenceServerException:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert client.is_model_ready("scaler") and not client.is_model_ready("lgbm")
        x = features(4, seed=14)
        mean, scale = served.scaler
        label = client.infer("scaled_xgb", _inputs({"raw": x})).as_numpy("label")
        expected = served.xgb.predict(xgboost.DMatrix((x - mean) / scale)) > 0.5
        np.testing.assert_array_equal(label[:, 0], expected.astype("f4"))
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
