"""Suite-wide settings: hypothesis profiles, and an event loop for synchronous Pulumi tests."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from stacks.mock_engine import ensure_event_loop
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
