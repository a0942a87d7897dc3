"""Log-probabilities of -inf, which real vLLM returns for the top-k tokens a grammar masks
(response_format json_schema with top_logprobs), leave as vLLM's server sends them: -9999.0.

In front of ``MaskedEngine``, a stand-in engine (in-process) whose one token has a masked
alternative.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.frontend.engine import ChoiceOutput, EngineOutput, GenerateParams, TokenLogprob
from tests.frontend.conftest import InProcessEngine, serve_engine

MODEL = "toy-llm"
FLOOR = -9999.0


class MaskedEngine(InProcessEngine):
    """Stand-in engine: one token, "the", whose second-ranked alternative is masked (-inf)."""

    async def generate(self, params: GenerateParams) -> AsyncGenerator[EngineOutput, None]:
        logprob = TokenLogprob(
            "the", 0.0, (TokenLogprob("the", 0.0), TokenLogprob("cat", float("-inf")))
        )
        yield EngineOutput(
            (ChoiceOutput(0, "the", "length", 1, (logprob,)),), prompt_tokens=1, finished=True
        )


@pytest.fixture(scope="module")
def url(tokenizer_dir: Path) -> Iterator[str]:
    yield from serve_engine(tokenizer_dir, MaskedEngine())


def _post(url: str, route: str, body: dict[str, Any]) -> httpx.Response:
    response = httpx.post(url + route, json={"model": MODEL, "max_tokens": 1, **body}, timeout=30)
    assert response.status_code == 200, response.text
    return response


CHAT = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2}


def test_chat_masked_logprob_is_the_floor(url: str) -> None:
    content = _post(url, "/v1/chat/completions", CHAT).json()["choices"][0]["logprobs"]["content"]
    assert [t["logprob"] for t in content[0]["top_logprobs"]] == [0.0, FLOOR]


def test_streamed_chat_masked_logprob_is_the_floor(url: str) -> None:
    response = _post(url, "/v1/chat/completions", {**CHAT, "stream": True})
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    content = json.loads(events[0])["choices"][0]["logprobs"]["content"]
    assert [t["logprob"] for t in content[0]["top_logprobs"]] == [0.0, FLOOR]


def test_completion_masked_logprob_is_the_floor(url: str) -> None:
    reply = _post(url, "/v1/completions", {"prompt": "hi", "logprobs": 2}).json()
    assert reply["choices"][0]["logprobs"]["top_logprobs"] == [{"the": 0.0, "cat": FLOOR}]
