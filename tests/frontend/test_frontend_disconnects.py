"""A client that goes away: every backend request of its request is cancelled, and the server
records a 499 in its access log instead of logging an application error.

Real sockets under uvicorn, in front of ``HoldingEngine``, a stand-in engine (in-process) whose
calls wait until they are cancelled, so a test chooses when the client leaves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.frontend.engine import ChoiceOutput, EngineOutput, GenerateParams
from runtime.frontend.middleware import ACCESS_LOGGER
from tests.frontend.conftest import InProcessEngine, Served, frontend_settings, serve

MODEL = "toy-llm"
# Generous: a loaded 2-core machine, not a timing under test.
WAIT_S = 30.0


class HoldingEngine(InProcessEngine):
    """Stand-in engine: a generation sends one token, an embedding nothing, then each waits
    until it is cancelled; ``started`` and ``cancelled`` name the calls (prompt or input)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.cancelled: list[str] = []

    async def generate(self, params: GenerateParams) -> AsyncIterator[EngineOutput]:
        self.started.append(params.prompt)
        try:
            yield EngineOutput((ChoiceOutput(0, " held", None, 1),), 1)
            await asyncio.Event().wait()
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.append(params.prompt)
            raise

    async def embed(self, text: str, dimensions: int | None) -> tuple[list[float], int]:
        self.started.append(text)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(text)
            raise
        raise AssertionError("unreachable")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def holding(tokenizer_dir: Path) -> Iterator[tuple[Served, HoldingEngine]]:
    engine = HoldingEngine()
    served = serve(frontend_settings("127.0.0.1:1", tokenizer_dir), None, engine)
    yield served, engine
    served.stop()


@pytest.fixture
def logs(holding: tuple[Served, HoldingEngine]) -> Iterator[_Records]:
    """Records of uvicorn's error logger (it does not propagate to the root) and access lines."""
    records = _Records()
    access = logging.getLogger(ACCESS_LOGGER)
    level = access.level
    access.setLevel(logging.INFO)
    loggers = [logging.getLogger("uvicorn.error"), access]
    for logger in loggers:
        logger.addHandler(records)
    holding[1].started.clear()
    holding[1].cancelled.clear()
    yield records
    for logger in loggers:
        logger.removeHandler(records)
    access.setLevel(level)


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"{what} within {WAIT_S:g} s"
        time.sleep(0.02)


def _access(records: _Records, path: str) -> list[dict[str, Any]]:
    lines = [json.loads(r.getMessage()) for r in records.records if r.name == ACCESS_LOGGER]
    return [line for line in lines if line["path"] == path]


def _settle(served: Served) -> None:
    """Let the server loop finish the departed request's task (its logging included): it
    answers a later request only after that step."""
    assert httpx.get(served.url + "/health/live", timeout=WAIT_S).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "calls"),
    [
        ("/v1/completions", {"prompt": ["hold a", "hold b"], "max_tokens": 5}, 2),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 1),
        ("/v1/embeddings", {"input": ["hold a", "hold b"]}, 2),
    ],
)
def test_leaving_a_non_streamed_request_cancels_it_and_logs_499_not_an_error(
    holding: tuple[Served, HoldingEngine],
    logs: _Records,
    path: str,
    body: dict[str, Any],
    calls: int,
) -> None:
    served, engine = holding
    raw = json.dumps({"model": MODEL, **body}).encode()
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as client:
        client.sendall(
            f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n".encode()
            + raw
        )
        _until(lambda: len(engine.started) == calls, "the backend calls started")
    _until(lambda: len(engine.cancelled) == calls, "every backend call was cancelled")
    _until(lambda: bool(_access(logs, path)), "the access line was written")
    _settle(served)
    assert [line["status"] for line in _access(logs, path)] == [499]
    errors = [r for r in logs.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


def test_leaving_a_streamed_multi_prompt_request_cancels_every_prompt(
    holding: tuple[Served, HoldingEngine], logs: _Records
) -> None:
    served, engine = holding
    body = {"model": MODEL, "prompt": ["hold a", "hold b"], "max_tokens": 5, "stream": True}
    with httpx.stream("POST", served.url + "/v1/completions", json=body, timeout=WAIT_S) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["text"] == " held"
        _until(lambda: len(engine.started) == 2, "both prompts started")
    # Leaving the block closed the connection with the stream open.
    _until(lambda: sorted(engine.cancelled) == ["hold a", "hold b"], "both prompts cancelled")
    _until(lambda: bool(_access(logs, "/v1/completions")), "the access line was written")
    _settle(served)
    errors = [r for r in logs.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    assert served.state.open_streams == 0
