"""Running one generation to completion and the pieces both completion routes share."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from runtime.frontend.coalesce import coalesced
from runtime.frontend.engine import Engine, EngineOutput, GenerateParams, TokenLogprob
from runtime.frontend.errors import (
    BackendError,
    IncompleteOutputError,
    InvalidOutputError,
    TruncatedOutputError,
)
from runtime.frontend.schemas import StreamOptions
from runtime.frontend.state import FrontendState
from runtime.frontend.structured import OutputRequirement
from runtime.frontend.token_names import TokenNames

__all__ = [
    "ChunkFrame",
    "Collected",
    "Generation",
    "UsageReport",
    "collect",
    "counted_invalid_output",
    "envelope",
    "merge_streams",
    "new_id",
    "now",
    "openai_logprob",
    "prompt_logprobs_field",
    "stop_field",
    "stream_outputs",
    "usage",
    "validated_output",
]

T = TypeVar("T")

#: What vLLM's server and OpenAI send for a token that cannot be sampled (JSON has no -inf).
_LOGPROB_FLOOR = -9999.0


def stop_field(
    stop: str | Sequence[str] | None, stop_token_ids: Sequence[int] | None
) -> str | None:
    """The request field whose stop sequences can end a choice early, if the client sent one."""
    if stop:
        return "stop"
    return "stop_token_ids" if stop_token_ids else None


@contextlib.contextmanager
def counted_invalid_output(
    state: FrontendState, route: str, index: int, finish_reason: str | None, stop: str | None
) -> Iterator[None]:
    """Count output that breaks the format the engine was asked to hold, then raise it.

    The engine ends such output only when it is complete, so a choice that stopped unfinished
    while the client sent stop sequences (``stop`` names the field) was cut by them: a 400,
    not a 502. Complete output that breaks the format stays the engine's fault.
    """
    try:
        yield
    except InvalidOutputError as exc:
        state.metrics.invalid_output.labels(state.settings.model_id, route).inc()
        if not isinstance(exc, IncompleteOutputError) or finish_reason != "stop" or stop is None:
            raise
        raise TruncatedOutputError(
            f"choice {index} stopped before the requested format was complete, and the "
            "request's stop sequences (stop, stop_token_ids) can end output early; the "
            "response was withheld: leave out the sequences that the requested output can "
            "contain",
            param=stop,
            code="output_stopped",
        ) from None
    except TruncatedOutputError:
        state.metrics.invalid_output.labels(state.settings.model_id, route).inc()
        raise


def validated_output(
    state: FrontendState,
    route: str,
    requirement: OutputRequirement,
    text: str,
    index: int,
    finish_reason: str | None,
    stop: str | None = None,
) -> None:
    """Check a finished choice's text against the request's requirement; output that fails it
    is counted on ``llm_serving_frontend_invalid_output``, then raised (see
    :func:`counted_invalid_output` for ``stop``)."""
    with counted_invalid_output(state, route, index, finish_reason, stop):
        requirement.validate(text, index=index, finish_reason=finish_reason)


def new_id(prefix: str, given: str | None = None) -> str:
    """A response id: the client's ``request_id`` after ``prefix``, or a new one."""
    return f"{prefix}-{given or uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def openai_logprob(value: float) -> float:
    """``value`` as JSON can carry it: vLLM gives -inf to tokens a grammar masks, which
    Starlette refuses to encode (a 500) and orjson writes as ``null``."""
    return max(value, _LOGPROB_FLOOR)


def prompt_logprobs_field(
    positions: tuple[TokenLogprob | None, ...] | None, top: int, names: TokenNames
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs`` response field: per prompt token ``None`` for the first (nothing
    precedes it), else that token's entry and the ``top`` likeliest, keyed by token id."""
    if positions is None:
        raise BackendError("Triton returned no prompt log-probabilities")
    out: list[dict[str, dict[str, Any]] | None] = []
    for there in positions:
        if there is None:
            out.append(None)
            continue
        out.append(
            {
                str(e.token_id): {
                    "logprob": openai_logprob(e.logprob),
                    "rank": e.rank,
                    "decoded_token": names.name(e.token_id, e.token)[0],
                }
                for e in (there, *there.top[:top])
            }
        )
    return out


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
) -> dict[str, Any]:
    """The OpenAI ``usage`` object; ``prompt_tokens_details`` where the backend counted the
    prompt tokens its prefix cache served."""
    reply: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        reply["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return reply


def envelope(
    request_id: str, object_type: str, created: int, model: str, choices: list[dict[str, Any]]
) -> dict[str, Any]:
    """The fields every completion response and stream chunk carries around its choices."""
    return {
        "id": request_id,
        "object": object_type,
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
    }


class ChunkFrame:
    """A stream's chunk envelope serialized once; each chunk then encodes only its choices.

    ``encode`` returns the server-sent event: the :func:`envelope` with these choices, then any
    ``fields`` (and ``"usage": null`` when usage is streamed), compact JSON in UTF-8.
    """

    def __init__(
        self, request_id: str, object_type: str, created: int, model: str, include_usage: bool
    ) -> None:
        empty = orjson.dumps(envelope(request_id, object_type, created, model, []))
        # The envelope ends with its choices: cut the empty list open.
        self._head = b"data: " + empty[: -len(b"]}")]
        self._tail = b',"usage":null}\n\n' if include_usage else b"}\n\n"

    def encode(
        self,
        choices: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
    ) -> bytes:
        chunk = self._head + orjson.dumps(choices)[1:-1] + b"]"
        if fields:
            chunk += b"," + orjson.dumps(fields)[1:-1]
        if usage is None:
            return chunk + self._tail
        return chunk + b',"usage":' + orjson.dumps(usage) + b"}\n\n"


@dataclass(frozen=True)
class UsageReport:
    """What a stream reports of usage: a last chunk with the totals (``include_usage``), and
    with vLLM's ``continuous_usage_stats`` the request's totals so far on every chunk."""

    final: bool
    continuous: bool

    @classmethod
    def of(cls, options: StreamOptions | None) -> UsageReport:
        final = bool(options and options.include_usage)
        return cls(final, final and bool(options and options.continuous_usage_stats))


def stream_outputs(engine: Engine, params: GenerateParams) -> AsyncGenerator[EngineOutput, None]:
    """A streamed generation's outputs; those already waiting are merged into one, unless
    per-token log-probabilities were asked for (each chunk then carries its own token's)."""
    outputs = engine.generate(params)
    return outputs if params.logprobs else coalesced(outputs)


async def merge_streams(
    streams: Sequence[AsyncGenerator[T, None]], closing_tasks: set[asyncio.Future[None]]
) -> AsyncGenerator[tuple[int, T], None]:
    """Items of all ``streams`` as they come, each with its stream's index; closing this
    iterator, or an error from one stream, closes every stream (in a task kept in
    ``closing_tasks`` until done).

    A stream is asked for its next item only once its previous one has been taken, so a
    :func:`coalesced` stream still merges what arrives while the consumer is busy.
    """

    if len(streams) == 1:
        # The common case, without a task per item.
        async with contextlib.aclosing(streams[0]) as only:
            async for item in only:
                yield 0, item
        return

    async def advance(stream: AsyncGenerator[T, None]) -> T:
        return await anext(stream)

    pending = {asyncio.ensure_future(advance(s)): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            # In stream order, so that outputs ready together leave in a stable order.
            for task in sorted(done, key=pending.__getitem__):
                index = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                yield index, item
                pending[asyncio.ensure_future(advance(streams[index]))] = index
    finally:
        for task in pending:
            task.cancel()
        # Shielded: Starlette's task group cancels a departed client's stream again on every
        # loop iteration, which would otherwise cut this wait short and leave streams open.
        closing = asyncio.ensure_future(_close_streams(pending, streams))
        # The event loop holds tasks weakly: one left running by a cancelled shield needs this.
        closing_tasks.add(closing)
        closing.add_done_callback(closing_tasks.discard)
        await asyncio.shield(closing)


async def _close_streams(
    reading: Collection[asyncio.Future[Any]], streams: Sequence[AsyncGenerator[Any, None]]
) -> None:
    if reading:
        await asyncio.wait(reading)
    for task in reading:
        if not task.cancelled():
            task.exception()  # retrieved: a second failure is not logged as never seen
    # A stream whose next item was being read ended with that read's cancellation; the others
    # are suspended at a yield (or never started) and end here.
    for stream in streams:
        # One stream failing to close must not leave the others' requests running.
        with contextlib.suppress(Exception):
            await stream.aclose()


@dataclass
class Collected:
    """The accumulated result of one choice."""

    text: str = ""
    finish_reason: str | None = None
    tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_reason: str | int | None = None


@dataclass
class Generation:
    """A non-streamed generation: its choices, the prompt's token count and, when the
    sampling parameters ask for them, the prompt's log-probabilities; the prompt tokens the
    prefix cache served, where the backend counts them."""

    choices: list[Collected]
    prompt_tokens: int = 0
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    cached_tokens: int | None = None


async def collect(engine: Engine, params: GenerateParams, n: int) -> Generation:
    """All ``n`` choices of a non-streamed generation."""
    result = Generation([Collected() for _ in range(n)])
    async for output in engine.generate(params):
        if output.prompt_tokens is not None:
            result.prompt_tokens = output.prompt_tokens
        if result.prompt_logprobs is None:
            result.prompt_logprobs = output.prompt_logprobs
        if output.cached_tokens is not None:
            result.cached_tokens = output.cached_tokens
        for c in output.choices:
            slot = result.choices[c.index]
            slot.text += c.text
            slot.tokens += c.num_tokens
            slot.logprobs.extend(c.logprobs)
            slot.finish_reason = c.finish_reason or slot.finish_reason
            if c.finish_reason is not None:
                slot.stop_reason = c.stop_reason
    return result
