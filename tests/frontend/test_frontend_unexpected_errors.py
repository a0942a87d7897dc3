"""A bug behind a route (an exception no handler expects) still answers in the OpenAI error
format: a JSON 500 before output starts, an error event then the end of a started stream.
The traceback goes to the log, never to the client."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path

import httpx
import pytest

from runtime.frontend.engine import (
    ChoiceOutput,
    EngineOutput,
    GenerateParams,
)
from tests.frontend.conftest import InProcessEngine, serve_engine

SECRET = "internal detail /srv/secret"


class BrokenEngine(InProcessEngine):
    """Yields ``before`` outputs, then raises an exception that is not a FrontendError."""

    def __init__(self, before: int) -> None:
        self.before = before

    async def generate(self, params: GenerateParams) -> AsyncGenerator[EngineOutput, None]:
        for i in range(self.before):
            yield EngineOutput((ChoiceOutput(0, f" w{i}", None, 1, ()),), prompt_tokens=2)
        raise KeyError(SECRET)

    async def embed(self, text: str, dimensions: int | None) -> tuple[list[float], int]:
        raise ZeroDivisionError(SECRET)


@pytest.fixture(scope="module")
def broken_at_once(tokenizer_dir: Path) -> Iterator[str]:
    yield from serve_engine(tokenizer_dir, BrokenEngine(0))


@pytest.fixture(scope="module")
def broken_mid_stream(tokenizer_dir: Path) -> Iterator[str]:
    yield from serve_engine(tokenizer_dir, BrokenEngine(2))


def _internal(body: dict) -> None:
    assert body["error"]["code"] == "internal_error"
    assert body["error"]["type"] == "server_error"
    assert SECRET not in json.dumps(body)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/embeddings", {"input": "hi"}),
    ],
)
def test_an_unexpected_error_is_a_json_500(
    broken_at_once: str, route: str, body: dict, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="runtime.frontend"):
        response = httpx.post(broken_at_once + route, json={"model": "toy-llm", **body}, timeout=30)
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    _internal(response.json())
    assert any(SECRET in r.getMessage() and r.exc_info for r in caplog.records)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ],
)
def test_an_unexpected_error_mid_stream_ends_it_with_an_error_event(
    broken_mid_stream: str, route: str, body: dict
) -> None:
    request = {"model": "toy-llm", "stream": True, "max_tokens": 8, **body}
    response = httpx.post(broken_mid_stream + route, json=request, timeout=30)
    assert response.status_code == 200
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    chunks = [json.loads(e) for e in events]
    assert any("choices" in c and c["choices"] for c in chunks[:-1])
    _internal(chunks[-1])
