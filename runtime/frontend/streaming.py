"""Server-sent events, the bound on open streams, deadlines and client-disconnect cancellation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Coroutine, Iterable
from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import StreamingResponse

from runtime.frontend.errors import (
    ClientDisconnectedError,
    DeadlineExceededError,
    FrontendError,
    RateLimitError,
    error_body,
    internal_error,
)
from runtime.frontend.state import FrontendState

__all__ = ["gather_or_cancel", "run_until_disconnect", "sse_response"]

T = TypeVar("T")


def sse(data: bytes | dict[str, Any] | str) -> bytes:
    """One server-sent event; ``bytes`` are an event already framed (:class:`ChunkFrame`)."""
    if isinstance(data, bytes):
        return data
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    return b"data: " + payload + b"\n\n"


async def run_until_disconnect(request: Request, work: Awaitable[T], timeout_s: float) -> T:
    """Await ``work`` unless the client goes away (cancel it, then
    :class:`ClientDisconnectedError`) or the deadline passes (504)."""
    task = asyncio.ensure_future(work)
    disconnected = False

    async def watch() -> None:
        nonlocal disconnected
        # The body has been read, so the next ASGI message is the disconnect (no polling).
        while (await request.receive())["type"] != "http.disconnect":
            pass
        disconnected = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        async with asyncio.timeout(timeout_s):
            return await task
    except TimeoutError:
        raise DeadlineExceededError(
            f"the request did not finish within {timeout_s:g} s", code="deadline_exceeded"
        ) from None
    except asyncio.CancelledError:
        # Only the work was cancelled, for the departed client: a CancelledError raised out of
        # the endpoint would reach uvicorn as an application error. A cancellation of this
        # task itself (server shutdown) still propagates.
        current = asyncio.current_task()
        if disconnected and current is not None and not current.cancelling():
            raise ClientDisconnectedError(
                "the client disconnected before the response was ready",
                code="client_disconnected",
            ) from None
        raise
    finally:
        watcher.cancel()
        task.cancel()


async def gather_or_cancel(works: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Results of ``works``, run concurrently; the first failure cancels the others, waits
    until they have ended (their backend requests cancelled), and is raised as it is."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(work) for work in works]
    except BaseExceptionGroup as failed:
        # The routes' error handlers map single typed errors, not groups.
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


async def sse_response(
    state: FrontendState, events: AsyncGenerator[bytes | dict[str, Any], None]
) -> StreamingResponse:
    """Stream ``events`` as SSE, bounded by the open-stream limit and the request deadline.

    The first event is awaited before the response starts, so errors that happen before any
    output (a refused request, an unreachable backend) keep their HTTP status.
    """
    settings = state.settings
    if state.open_streams >= settings.max_concurrent_streams:
        raise RateLimitError(
            f"{settings.max_concurrent_streams} streams are open; retry later",
            code="too_many_streams",
        )
    state.open_streams += 1
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            state.open_streams -= 1

    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.request_timeout_s
    try:
        async with asyncio.timeout_at(deadline):
            first = await anext(events)
    except StopAsyncIteration:
        first = None
    except TimeoutError:
        release()
        await events.aclose()
        raise DeadlineExceededError(
            f"no output within {settings.request_timeout_s:g} s", code="deadline_exceeded"
        ) from None
    except BaseException:
        release()
        await events.aclose()
        raise

    async def body() -> AsyncIterator[bytes]:
        try:
            if first is None:
                return
            yield sse(first)
            async with asyncio.timeout_at(deadline):
                async for event in events:
                    yield sse(event)
            yield sse("[DONE]")
        except TimeoutError:
            yield sse(
                error_body(
                    DeadlineExceededError(
                        f"the stream did not finish within {settings.request_timeout_s:g} s",
                        code="deadline_exceeded",
                    )
                )
            )
        except FrontendError as exc:
            # Errors after output started cannot change the status: the stream ends with them.
            yield sse(error_body(exc))
        except Exception as exc:
            yield sse(error_body(internal_error(exc)))
        finally:
            release()
            with contextlib.suppress(Exception):
                await events.aclose()

    return StreamingResponse(body(), media_type="text/event-stream")
