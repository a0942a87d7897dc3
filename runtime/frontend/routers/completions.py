"""``POST /v1/completions``: text prompts, one generation per prompt, ``n`` choices each."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from runtime.frontend.dependencies import AuthDep, StateDep, check_model
from runtime.frontend.engine import EngineOutput, GenerateParams, TokenLogprob
from runtime.frontend.errors import FieldRefusedError, InvalidRequestError, error_responses
from runtime.frontend.fields import check_fields
from runtime.frontend.generation import (
    ChunkFrame,
    collect,
    envelope,
    merge_streams,
    new_id,
    now,
    openai_logprob,
    stream_outputs,
    usage,
)
from runtime.frontend.sampling import build_sampling, check_logprobs, resolve_max_tokens
from runtime.frontend.schemas import CompletionRequest
from runtime.frontend.state import FrontendState
from runtime.frontend.streaming import gather_or_cancel, run_until_disconnect, sse_response

__all__ = ["DEFAULT_MAX_TOKENS", "ROUTE", "router"]

ROUTE = "/v1/completions"
# OpenAI's legacy completions and vLLM's CompletionRequest.max_tokens (chat's is the context).
DEFAULT_MAX_TOKENS = 16
router = APIRouter(tags=["completions"])


def _logprobs(items: list[TokenLogprob] | tuple[TokenLogprob, ...], top: int, offset: int):
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for t in items:
        tokens.append(t.token)
        token_logprobs.append(openai_logprob(t.logprob))
        tops.append({tok: openai_logprob(lp) for tok, lp in t.top[:top]})
        offsets.append(offset)
        offset += len(t.token)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _default_max_tokens(
    state: FrontendState, requested: int | None, prompt_tokens: int
) -> int | None:
    """``max_tokens`` as sent, else :data:`DEFAULT_MAX_TOKENS`; ``None`` for a prompt that
    leaves no room at all, which :func:`resolve_max_tokens` refuses as too long."""
    if requested is not None:
        return requested
    room = state.settings.max_model_len - prompt_tokens
    if room < 1:
        return None
    if room < DEFAULT_MAX_TOKENS:
        # vLLM refuses this prompt too rather than shorten the default budget.
        raise InvalidRequestError(
            f"the prompt is {prompt_tokens} tokens and max_tokens defaults to "
            f"{DEFAULT_MAX_TOKENS}, more than the {room} left of the model's context of "
            f"{state.settings.max_model_len} tokens; send max_tokens of at most {room} or a "
            "shorter prompt",
            param="prompt",
            code="context_length_exceeded",
        )
    return DEFAULT_MAX_TOKENS


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
    check_logprobs(body.logprobs, state.settings.max_logprobs, "logprobs")
    # check_fields refused token-id prompts: what is left is text.
    prompts = cast(list[str], [body.prompt] if isinstance(body.prompt, str) else list(body.prompt))
    if len(prompts) * n > state.settings.max_choices:
        raise InvalidRequestError(
            f"{len(prompts)} prompts x n={n} is more than {state.settings.max_choices} choices "
            "(LLM_SERVING_FRONTEND_MAX_CHOICES); split the request",
            param="prompt",
        )
    samplings = []
    for i, prompt in enumerate(prompts):
        prompt_tokens = state.prompt_tokens(prompt)
        if prompt_tokens == 0:
            # vLLM refuses it ("The decoder prompt cannot be empty"); "" that the tokenizer
            # turns into a BOS token is a prompt, as vLLM takes it.
            name = "prompt" if isinstance(body.prompt, str) else f"prompt[{i}]"
            raise InvalidRequestError(
                f"{name} is empty: it has no tokens for the model; send some text",
                param="prompt",
            )
        max_tokens = resolve_max_tokens(
            _default_max_tokens(state, body.max_tokens, prompt_tokens),
            prompt_tokens,
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


@router.post(ROUTE, responses=error_responses(400, 401, 404, 413, 429, 502, 503, 504))
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

    results = await run_until_disconnect(
        request,
        gather_or_cancel(collect(state.engine, p, n) for p in params),
        state.settings.request_timeout_s,
    )
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


class _PromptChoices:
    """What a stream has sent of one prompt's ``n`` choices, to turn its outputs into deltas."""

    def __init__(self, index: int, prompt: str, n: int, echo: bool, top: int | None) -> None:
        self.index = index
        self.prompt = prompt
        self.n = n
        self.top = top
        self.echoed = [not echo] * n
        self.done = [False] * n
        self.offsets = [0] * n
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def deltas(self, output: EngineOutput) -> list[dict[str, Any]]:
        """The chunk choices for ``output``; each keeps its index ``prompt_index * n + index``."""
        self.prompt_tokens = output.prompt_tokens or self.prompt_tokens
        deltas = []
        for c in output.choices:
            if self.done[c.index]:
                continue
            self.completion_tokens += c.num_tokens
            text = c.text
            if not self.echoed[c.index]:
                self.echoed[c.index] = True
                text = self.prompt + text
                self.offsets[c.index] = len(self.prompt)
            self.done[c.index] = c.finish_reason is not None
            deltas.append(
                {
                    "index": self.index * self.n + c.index,
                    "text": text,
                    "logprobs": _logprobs(c.logprobs, self.top, self.offsets[c.index])
                    if self.top is not None
                    else None,
                    "finish_reason": c.finish_reason,
                }
            )
            self.offsets[c.index] += len(text)
        return deltas


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
    frame = ChunkFrame(rid, "text_completion", created, body.model, include_usage)
    sent = [
        _PromptChoices(i, prompt, n, bool(body.echo), top if p.logprobs else None)
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True))
    ]
    # Prompts stream at once, their chunks interleaved as they come. Closed here, not left to
    # the garbage collector, so every prompt's backend request ends now.
    streams = [stream_outputs(state.engine, p) for p in params]
    async with aclosing(merge_streams(streams, state.closing_tasks)) as outputs:
        async for p_index, output in outputs:
            deltas = sent[p_index].deltas(output)
            if deltas:
                yield frame.encode(deltas)
    if include_usage:
        final = envelope(rid, "text_completion", created, body.model, [])
        final["usage"] = usage(
            sum(s.prompt_tokens for s in sent), sum(s.completion_tokens for s in sent)
        )
        yield final
