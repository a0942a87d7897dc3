"""Merging engine outputs that are already waiting into one, as vLLM's output collector does.

A stream pays per chunk (JSON, an HTTP write, the client's parse), not per token, so when the
backend has sent several responses while the previous chunk was being written, they leave as
one chunk. Nothing ever waits for more output: the first available output is sent at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from runtime.frontend.engine import ChoiceOutput, EngineOutput

__all__ = ["coalesced", "merge_outputs"]


def merge_outputs(outputs: list[EngineOutput]) -> EngineOutput:
    """One output equal to ``outputs`` in order: texts joined, token counts summed.

    A choice's entries after its finish reason are dropped (the backend repeats finished
    choices with empty text until every choice has finished).
    """
    if len(outputs) == 1:
        return outputs[0]
    merged: dict[int, ChoiceOutput] = {}
    prompt_tokens = cached_tokens = None
    for output in outputs:
        if output.prompt_tokens is not None:
            prompt_tokens = output.prompt_tokens
        if output.cached_tokens is not None:
            cached_tokens = output.cached_tokens
        for c in output.choices:
            before = merged.get(c.index)
            if before is None:
                merged[c.index] = c
            elif before.finish_reason is None:
                merged[c.index] = ChoiceOutput(
                    index=c.index,
                    text=before.text + c.text,
                    finish_reason=c.finish_reason,
                    num_tokens=before.num_tokens + c.num_tokens,
                    logprobs=before.logprobs + c.logprobs,
                    stop_reason=c.stop_reason,
                )
    return EngineOutput(
        choices=tuple(merged.values()),
        prompt_tokens=prompt_tokens,
        finished=outputs[-1].finished,
        cached_tokens=cached_tokens,
    )


async def coalesced(
    outputs: AsyncGenerator[EngineOutput, None],
) -> AsyncGenerator[EngineOutput, None]:
    """``outputs``, with those that arrive while the consumer is busy merged into one.

    A reader task drains the engine; the consumer takes everything read so far each time it
    asks. Closing this iterator cancels the reader, which closes ``outputs`` (and so cancels
    the backend request).
    """
    loop = asyncio.get_running_loop()
    ready: list[EngineOutput] = []
    wake: asyncio.Future[None] | None = None
    finished = False
    failure: BaseException | None = None

    async def read() -> None:
        nonlocal finished, failure
        try:
            async for output in outputs:
                ready.append(output)
                if wake is not None and not wake.done():
                    wake.set_result(None)
        except Exception as exc:  # handed to the consumer, which raises it in its own task
            failure = exc
        finally:
            finished = True
            if wake is not None and not wake.done():
                wake.set_result(None)

    reader = loop.create_task(read())
    try:
        while True:
            if not ready and not finished:
                wake = loop.create_future()
                await wake
                wake = None
            if ready:
                batch = ready.copy()
                ready.clear()
                yield merge_outputs(batch)
            elif finished:
                if failure is not None:
                    raise failure
                return
    finally:
        reader.cancel()
        # wait() neither raises the reader's cancellation nor swallows one aimed at this task.
        await asyncio.wait((reader,))
        await outputs.aclose()
