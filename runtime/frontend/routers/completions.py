"""``POST /v1/completions``: text prompts, one generation per prompt, ``n`` choices each."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from runtime.frontend.dependencies import AuthDep, StateDep, check_model
from runtime.frontend.engine import GenerateParams, TokenLogprob
from runtime.frontend.errors import FieldRefusedError, InvalidRequestError
from runtime.frontend.fields import check_fields
from runtime.frontend.generation import (
    ChunkFrame,
    collect,
    envelope,
    new_id,
    now,
    stream_outputs,
    usage,
)
from runtime.frontend.sampling import build_sampling, resolve_max_tokens
from runtime.frontend.schemas import CompletionRequest
from runtime.frontend.state import FrontendState
from runtime.frontend.streaming import run_until_disconnect, sse_response

__all__ = ["ROUTE", "router"]

ROUTE = "/v1/completions"
router = APIRouter(tags=["completions"])


def _logprobs(items: list[TokenLogprob] | tuple[TokenLogprob, ...], top: int, offset: int):
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for t in items:
        tokens.append(t.token)
        token_logprobs.append(t.logprob)
        tops.append({tok: lp for tok, lp in t.top[:top]})
        offsets.append(offset)
        offset += len(t.token)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _prepare(
    state: FrontendState, body: CompletionRequest
) -> tuple[list[str], list[dict[str, Any]]]:
    check_fields(ROUTE, body)
    check_model(state, body.model)
    n = body.n or 1
    if body.best_of is not None and body.best_of != n:
        raise FieldRefusedError(
            "best_of", f"vLLM V1 has no best_of; send best_of equal to n ({n}) or omit it"
        )
    if body.echo and body.logprobs is not None:
        raise FieldRefusedError(
            "echo", "echo with logprobs needs prompt log-probabilities the backend does not return"
        )
    if body.stream_options is not None and not body.stream:
        raise InvalidRequestError("stream_options requires stream=true", param="stream_options")
    # check_fields refused token-id prompts: what is left is text.
    prompts = cast(list[str], [body.prompt] if isinstance(body.prompt, str) else list(body.prompt))
    if len(prompts) * n > state.settings.max_choices:
        raise InvalidRequestError(
            f"{len(prompts)} prompts x n={n} is more than {state.settings.max_choices} choices "
            "(LLM_SERVING_FRONTEND_MAX_CHOICES); split the request",
            param="prompt",
        )
    samplings = []
    for prompt in prompts:
        max_tokens = resolve_max_tokens(
            body.max_tokens,
            state.prompt_tokens(prompt),
            state.settings.max_model_len,
            "max_tokens",
            prompt_field="prompt",
        )
        samplings.append(
            build_sampling(
                body,
                max_tokens=max_tokens,
                logprobs=body.logprobs,
                structured=None,
                vocab_size=state.tokenizer.get_vocab_size(),
            )
        )
    return prompts, samplings


@router.post(ROUTE)
async def create_completion(
    body: CompletionRequest, request: Request, _: AuthDep, state: StateDep
) -> Any:
    """Create a text completion; every field follows the field table (docs/frontend-fields.md)."""
    prompts, samplings = _prepare(state, body)
    n = body.n or 1
    rid = new_id("cmpl")
    want_logprobs = body.logprobs is not None
    top = body.logprobs or 0
    stream = bool(body.stream)
    params = [
        GenerateParams(p, s, stream, want_logprobs, f"{rid}-{i}")
        for i, (p, s) in enumerate(zip(prompts, samplings, strict=True))
    ]
    if stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return await sse_response(
            state, _events(state, body, rid, prompts, params, n, include_usage, top)
        )

    async def run_all():
        return await asyncio.gather(*(collect(state.engine, p, n) for p in params))

    results = await run_until_disconnect(request, run_all(), state.settings.request_timeout_s)
    choices = []
    prompt_tokens = completion_tokens = 0
    for p_index, (collected, p_tokens) in enumerate(results):
        prompt_tokens += p_tokens
        prefix = prompts[p_index] if body.echo else ""
        for c_index, c in enumerate(collected):
            completion_tokens += c.tokens
            choices.append(
                {
                    "index": p_index * n + c_index,
                    "text": prefix + c.text,
                    "logprobs": _logprobs(c.logprobs, top, len(prefix)) if want_logprobs else None,
                    "finish_reason": c.finish_reason,
                }
            )
    # A Response skips FastAPI's jsonable_encoder pass over the dict (per-request cost).
    return JSONResponse(
        {
            **envelope(rid, "text_completion", now(), body.model, choices),
            "usage": usage(prompt_tokens, completion_tokens),
        }
    )


async def _events(
    state: FrontendState,
    body: CompletionRequest,
    rid: str,
    prompts: list[str],
    params: list[GenerateParams],
    n: int,
    include_usage: bool,
    top: int,
) -> AsyncGenerator[bytes | dict[str, Any], None]:
    created = now()
    prompt_tokens = completion_tokens = 0
    frame = ChunkFrame(rid, "text_completion", created, body.model, include_usage)

    # Prompts stream one after another; each choice keeps its index p_index * n + c_index.
    for p_index, p in enumerate(params):
        echoed = [not body.echo] * n
        done = [False] * n
        offsets = [0] * n
        p_tokens = 0
        # Closed here, not left to the garbage collector, so the backend request ends now.
        async with aclosing(stream_outputs(state.engine, p)) as outputs:
            async for output in outputs:
                p_tokens = output.prompt_tokens or p_tokens
                deltas = []
                for c in output.choices:
                    if done[c.index]:
                        continue
                    completion_tokens += c.num_tokens
                    text = c.text
                    if not echoed[c.index]:
                        echoed[c.index] = True
                        text = prompts[p_index] + text
                        offsets[c.index] = len(prompts[p_index])
                    done[c.index] = c.finish_reason is not None
                    deltas.append(
                        {
                            "index": p_index * n + c.index,
                            "text": text,
                            "logprobs": _logprobs(c.logprobs, top, offsets[c.index])
                            if p.logprobs
                            else None,
                            "finish_reason": c.finish_reason,
                        }
                    )
                    offsets[c.index] += len(text)
                if deltas:
                    yield frame.encode(deltas)
        prompt_tokens += p_tokens
    if include_usage:
        final = envelope(rid, "text_completion", created, body.model, [])
        final["usage"] = usage(prompt_tokens, completion_tokens)
        yield final
