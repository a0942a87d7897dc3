"""Running one generation to completion and the pieces both completion routes share."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from runtime.frontend.engine import Engine, GenerateParams, TokenLogprob

__all__ = ["Collected", "collect", "envelope", "new_id", "now", "usage"]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The OpenAI ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


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


@dataclass
class Collected:
    """The accumulated result of one choice."""

    text: str = ""
    finish_reason: str | None = None
    tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)


async def collect(engine: Engine, params: GenerateParams, n: int) -> tuple[list[Collected], int]:
    """All ``n`` choices of a non-streamed generation and the prompt's token count."""
    choices = [Collected() for _ in range(n)]
    prompt_tokens = 0
    async for output in engine.generate(params):
        if output.prompt_tokens is not None:
            prompt_tokens = output.prompt_tokens
        for c in output.choices:
            slot = choices[c.index]
            slot.text += c.text
            slot.tokens += c.num_tokens
            slot.logprobs.extend(c.logprobs)
            slot.finish_reason = c.finish_reason or slot.finish_reason
    return choices, prompt_tokens
