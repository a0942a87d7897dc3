"""Embedded mode: the entrypoint also starts the OpenAI frontend and waits for it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from runtime.constraints.catalog import CATALOG_DIR_ENV, load_catalog
from runtime.entrypoint import ExitCode
from tests.runtime.pod import Pod, http_status, infer
from tests.runtime.wheelmaker import make_source
from tests.support.ports import free_port


def test_embedded_mode_starts_the_frontend_pointed_at_triton(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src", engine_args={"max_model_len": 128, "max_logprobs": 3})
    pod = Pod.create(tmp_path, source=source)
    record = tmp_path / "frontend-env.json"
    frontend_port = free_port()
    pod.env.update(
        {
            "LLM_SERVING_SERVING_MODE": "embedded",
            "LLM_SERVING_FRONTEND_COMMAND": f"{sys.executable} -m tests.runtime.fake_frontend",
            "LLM_SERVING_FRONTEND_PORT": str(frontend_port),
            "FAKE_FRONTEND_RECORD": str(record),
        }
    )
    pod.start().wait_ready()
    seen = json.loads(record.read_text())
    # Triton's own public port, on loopback: the frontend takes no hop either.
    assert seen["LLM_SERVING_FRONTEND_TRITON_URL"] == f"127.0.0.1:{pod.port('public_grpc')}"
    assert seen["LLM_SERVING_FRONTEND_MODEL_NAME"] == "toy"
    assert seen["LLM_SERVING_FRONTEND_TOKENIZER_DIR"].endswith("/package/tokenizer")
    assert seen["LLM_SERVING_FRONTEND_MAX_MODEL_LEN"] == "128"
    assert seen["LLM_SERVING_FRONTEND_MAX_LOGPROBS"] == "3"
    # The catalogs reach the processes as the constraint engine's one contract: a folder of
    # <name>.jsonl, read by the engine's own loader.
    catalogs = Path(seen[CATALOG_DIR_ENV])
    assert sorted(p.name for p in catalogs.iterdir()) == ["titles.jsonl"]
    assert load_catalog(catalogs, "titles").ids == ("t1", "t2")
    assert http_status(frontend_port, "/health/ready") == 200
    assert infer(pod.port("public_grpc"), "the fox") != ""
    code, err = pod.terminate()
    assert code == 0, err
    assert "embedded mode: OpenAI frontend" in err


def test_embedded_mode_needs_the_models_max_model_len(tmp_path: Path) -> None:
    # Forced onto a standalone package without one, the frontend would assume its own limit.
    source = make_source(tmp_path / "src", engine_args={"tensor_parallel_size": 1})
    pod = Pod.create(tmp_path, source=source)
    pod.env.update(
        {
            "LLM_SERVING_SERVING_MODE": "embedded",
            "LLM_SERVING_FRONTEND_COMMAND": f"{sys.executable} -m tests.runtime.fake_frontend",
            "LLM_SERVING_FRONTEND_PORT": str(free_port()),
        }
    )
    code, err = pod.run_to_exit()
    assert code == ExitCode.STAGE_START, err
    assert "stage 7/8 start failed: embedded mode needs engine_args.max_model_len" in err, err
    assert pod.leftover_servers() == []
