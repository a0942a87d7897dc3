"""Suite-wide settings and fixtures: hypothesis profiles, an event loop for synchronous Pulumi
tests, the tiny Llama and real Triton serving it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from runtime.entrypoint.render import structured_outputs_config
from runtime.serving_backend import BACKEND_NAME
from stacks.mock_engine import ensure_event_loop
from tests.support.real_triton import (
    REAL_EMBED_MODEL,
    REAL_MAX_MODEL_LEN,
    REAL_MODEL,
    TritonServer,
    prepare_triton,
    write_vllm_model,
)
from tests.support.tiny_llm import TinyLlm, tiny_llm_in

# CI (CI=true) must not fail on an example that no change of ours introduced: it replays a
# derandomized set, while local runs keep searching with fresh seeds. No per-example deadline:
# on a shared 2-core machine one stall would fail an unrelated property.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("dev", print_blob=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Give the main thread an open event loop when an earlier test's ``asyncio.run()`` left none.

    Pulumi's synchronous helpers (``pulumi.runtime.test``, the mock engine) run on the current
    loop, so without this a Pulumi test's outcome depended on which tests ran before it. A hook,
    not a fixture, so that module-scoped fixtures see the loop too.
    """
    ensure_event_loop()


@pytest.fixture(scope="session")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> TinyLlm:
    """The tiny random Llama the real-engine tests serve, built once per test session."""
    return tiny_llm_in(tmp_path_factory.mktemp("tiny-llm"))


@pytest.fixture(scope="session")
def real_triton(
    tiny_llm: TinyLlm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    """Real Triton with our backend over the real engine (a minute to start on 2 cores)."""
    install = prepare_triton()
    work = tmp_path_factory.mktemp("real-triton")
    limits = {"max_model_len": REAL_MAX_MODEL_LEN}
    # What stage 6 renders into model.json for structured outputs.
    generate = {**limits, "structured_outputs_config": structured_outputs_config(None)}
    write_vllm_model(
        work / "repository", REAL_MODEL, tiny_llm.path, backend=BACKEND_NAME, engine_args=generate
    )
    write_vllm_model(
        work / "repository",
        REAL_EMBED_MODEL,
        tiny_llm.path,
        backend=BACKEND_NAME,
        engine_args={**limits, "runner": "pooling", "convert": "embed"},
    )
    with TritonServer(
        install,
        work / "repository",
        [REAL_MODEL, REAL_EMBED_MODEL],
        log_path=work / "tritonserver.log",
        ready_timeout=600,
    ) as running:
        yield running
