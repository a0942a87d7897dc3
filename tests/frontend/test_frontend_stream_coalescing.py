"""Outputs already waiting leave as one chunk; tokens, finish reasons and usage stay exact, and
per-token log-probabilities keep one chunk per output."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from runtime.frontend.coalesce import coalesced, merge_outputs
from runtime.frontend.engine import (
    ChoiceOutput,
    EngineOutput,
    GenerateParams,
    TokenLogprob,
)
from tests.frontend.conftest import InProcessEngine, serve_engine


def _out(*choices: tuple[int, str, str | None], prompt: int | None = 3) -> EngineOutput:
    parts = tuple(
        ChoiceOutput(i, text, reason, 1, (TokenLogprob(text, -0.5),)) for i, text, reason in choices
    )
    return EngineOutput(parts, prompt, all(c.finish_reason for c in parts))


def test_merge_joins_texts_and_counts_and_drops_entries_after_a_finish() -> None:
    merged = merge_outputs(
        [
            _out((0, "a", None), (1, "x", None)),
            _out((0, " b", "stop"), (1, " y", None), prompt=None),
            _out((0, "", "stop"), (1, " z", "length")),
        ]
    )
    first, second = merged.choices
    assert (first.text, first.num_tokens, first.finish_reason) == ("a b", 2, "stop")
    assert (second.text, second.num_tokens, second.finish_reason) == ("x y z", 3, "length")
    assert [t.token for t in second.logprobs] == ["x", " y", " z"]
    assert merged.prompt_tokens == 3 and merged.finished


async def test_outputs_waiting_together_are_merged_and_a_lone_one_passes_through() -> None:
    gate = asyncio.Event()

    async def engine() -> AsyncIterator[EngineOutput]:
        for word in ("the", " cat", " sat"):
            yield _out((0, word, None))
        await gate.wait()
        yield _out((0, " down", "length"))

    stream = coalesced(engine())
    first = await anext(stream)  # the three outputs were read before the consumer asked
    assert first.choices[0].text == "the cat sat" and first.choices[0].num_tokens == 3
    gate.set()
    last = await anext(stream)
    assert last.choices[0].text == " down" and last.choices[0].finish_reason == "length"
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_an_engine_error_reaches_the_consumer() -> None:
    async def engine() -> AsyncIterator[EngineOutput]:
        yield _out((0, "a", None))
        raise RuntimeError("backend went away")

    with pytest.raises(RuntimeError, match="backend went away"):
        async for _ in coalesced(engine()):
            pass


async def test_closing_the_stream_closes_the_engine_iterator() -> None:
    closed = asyncio.Event()

    async def engine() -> AsyncIterator[EngineOutput]:
        try:
            yield _out((0, "a", None))
            await asyncio.Event().wait()  # never more output
            yield _out((0, "b", "stop"))
        finally:
            closed.set()

    stream = coalesced(engine())
    await anext(stream)
    await stream.aclose()
    assert closed.is_set()


class BurstEngine(InProcessEngine):
    """Sends every token of a generation at once, as a backend ahead of the frontend would."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    async def generate(self, params: GenerateParams) -> AsyncIterator[EngineOutput]:
        for i in range(self.tokens):
            last = i == self.tokens - 1
            reason = "length" if last else None
            lp = (
                (TokenLogprob(f"w{i}", -0.25, (TokenLogprob(f"w{i}", -0.25),)),)
                if params.logprobs
                else ()
            )
            yield EngineOutput(
                (ChoiceOutput(0, f" w{i}", reason, 1, lp),), prompt_tokens=2, finished=last
            )


@pytest.fixture(scope="module")
def burst_url(tokenizer_dir: Path) -> Iterator[str]:
    yield from serve_engine(tokenizer_dir, BurstEngine(12))


def _events(url: str, route: str, body: dict) -> list[dict]:
    response = httpx.post(url + route, json=body, timeout=30)
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_burst_leaves_in_fewer_chunks_with_exact_usage(burst_url: str, route: str) -> None:
    body = {"model": "toy-llm", "max_tokens": 12, "stream": True}
    body["stream_options"] = {"include_usage": True}
    if route == "/v1/completions":
        body["prompt"] = "the cat"
    else:
        body["messages"] = [{"role": "user", "content": "the cat"}]
    events = _events(burst_url, route, body)
    chunks = [e for e in events if e["choices"]]
    key = "text" if route == "/v1/completions" else "delta"

    def text(choice: dict) -> str:
        return choice["text"] if key == "text" else choice["delta"].get("content", "")

    assert "".join(text(c["choices"][0]) for c in chunks) == "".join(f" w{i}" for i in range(12))
    assert len(chunks) < 12
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert events[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 12, "total_tokens": 14}


def test_per_token_logprobs_keep_one_chunk_per_token(burst_url: str) -> None:
    body = {"model": "toy-llm", "prompt": "the cat", "max_tokens": 12, "stream": True}
    events = _events(burst_url, "/v1/completions", {**body, "logprobs": 1})
    assert len(events) == 12
    assert [e["choices"][0]["logprobs"]["tokens"] for e in events] == [[f"w{i}"] for i in range(12)]
