"""``POST /v1/completions``: text prompts, one generation per prompt, ``n`` choices each."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from runtime.frontend.dependencies import AuthDep, StateDep, check_model
from runtime.frontend.engine import EngineOutput, GenerateParams, TokenLogprob
from runtime.frontend.errors import (
    NOT_GENERATING,
    BackendError,
    FieldRefusedError,
    InvalidRequestError,
    error_responses,
)
from runtime.frontend.fields import check_fields
from runtime.frontend.generation import (
    ChunkFrame,
    UsageReport,
    collect,
    envelope,
    merge_streams,
    new_id,
    now,
    openai_logprob,
    prompt_logprobs_field,
    stop_field,
    stream_outputs,
    usage,
    validated_output,
)
from runtime.frontend.sampling import build_sampling, check_logprobs, resolve_max_tokens
from runtime.frontend.schemas import CompletionRequest
from runtime.frontend.state import FrontendState
from runtime.frontend.streaming import gather_or_cancel, run_until_disconnect, sse_response
from runtime.frontend.structured import (
    OutputRequirement,
    requirement_for,
    structured_outputs_value,
)
from runtime.frontend.token_names import TokenNames
from runtime.frontend.token_prompts import prompt_texts

__all__ = ["DEFAULT_MAX_TOKENS", "ROUTE", "router"]

ROUTE = "/v1/completions"
# OpenAI's legacy completions and vLLM's CompletionRequest.max_tokens (chat's is the context).
DEFAULT_MAX_TOKENS = 16
router = APIRouter(tags=["completions"])


@dataclass(frozen=True)
class _Unscored:
    """An echoed prompt's first token, which has no log-probability (nothing precedes it)."""

    token: str
    token_id: int | None


def _logprobs(
    items: Sequence[TokenLogprob | _Unscored], top: int, offset: int, names: TokenNames
) -> dict[str, Any]:
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for t in items:
        tokens.append(names.name(t.token_id, t.token)[0])
        if isinstance(t, TokenLogprob):
            token_logprobs.append(openai_logprob(t.logprob))
            tops.append(
                {names.name(e.token_id, e.token)[0]: openai_logprob(e.logprob) for e in t.top[:top]}
            )
        else:
            token_logprobs.append(None)
            tops.append(None)
        offsets.append(offset)
        # Offsets count characters of the text, in which a partial UTF-8 token has none yet.
        offset += len(t.token)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


@dataclass(frozen=True)
class _Echo:
    """How each choice of a prompt repeats it (``echo``): its text, whether nothing generated
    follows (``max_tokens`` 0), and with logprobs the token that starts it."""

    prompt: str
    only: bool
    first: _Unscored = _Unscored("", None)

    @classmethod
    def of(cls, state: FrontendState, prompt: str, only: bool, first_id: int | None) -> _Echo:
        """``first_id``: the prompt's first token where logprobs are asked for (the backend's
        prompt_logprobs has no entry at the first position to name it by)."""
        if first_id is None:
            return cls(prompt, only)
        return cls(prompt, only, _Unscored(state.tokenizer.decode([first_id], False), first_id))

    def apply(
        self,
        text: str,
        logprobs: Sequence[TokenLogprob],
        positions: tuple[TokenLogprob | None, ...] | None,
        want_logprobs: bool,
    ) -> tuple[str, list[TokenLogprob | _Unscored]]:
        """A choice's first text and logprobs entries with the prompt's in front."""
        generated: list[TokenLogprob | _Unscored] = [] if self.only else list(logprobs)
        text = self.prompt + ("" if self.only else text)
        if not want_logprobs:
            return text, generated
        if positions is None:
            raise BackendError("Triton returned no prompt log-probabilities for echo")
        return text, [*(self.first if p is None else p for p in positions), *generated]


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


@dataclass(frozen=True)
class _Prepared:
    """A request's prompts (as text and as the engine's token ids), each one's sampling
    parameters and echo, and the output requirement every choice is checked against."""

    prompts: list[str]
    prompt_ids: list[list[int]]
    samplings: list[dict[str, Any]]
    echoes: list[_Echo | None]
    requirement: OutputRequirement | None


def _prepare(state: FrontendState, body: CompletionRequest) -> _Prepared:
    check_fields(ROUTE, body)
    check_model(state.settings, body.model)
    n = body.n or 1
    if body.best_of is not None and body.best_of != n:
        raise FieldRefusedError(
            "best_of", f"vLLM V1 has no best_of; send best_of equal to n ({n}) or omit it"
        )
    if body.max_tokens == 0 and not body.echo:
        raise InvalidRequestError(
            "max_tokens=0 generates nothing to return; send at least 1, or echo=true (with "
            "logprobs, to score the prompt)",
            param="max_tokens",
        )
    if body.stream_options is not None and not body.stream:
        raise InvalidRequestError("stream_options requires stream=true", param="stream_options")
    check_logprobs(body.logprobs, state.settings.max_logprobs, "logprobs")
    check_logprobs(body.prompt_logprobs, state.settings.max_logprobs, "prompt_logprobs")
    requirement = requirement_for(body.response_format, body.structured_outputs)
    if requirement is not None and body.max_tokens == 0:
        field = "structured_outputs" if body.structured_outputs else "response_format"
        raise InvalidRequestError(
            f"{field} constrains generated text, and max_tokens=0 generates none; send "
            "max_tokens of at least 1",
            param=field,
        )
    structured = (
        (state.structured_key, structured_outputs_value(requirement.spec()))
        if requirement is not None
        else None
    )
    prompts = prompt_texts(state, body.prompt, "prompt")
    if len(prompts) * n > state.settings.max_choices:
        raise InvalidRequestError(
            f"{len(prompts)} prompts x n={n} is more than {state.settings.max_choices} choices "
            "(LLM_SERVING_FRONTEND_MAX_CHOICES); split the request",
            param="prompt",
        )
    samplings = []
    echoes: list[_Echo | None] = []
    all_ids = [state.prompt_ids(prompt) for prompt in prompts]
    for i, (prompt, ids) in enumerate(zip(prompts, all_ids, strict=True)):
        prompt_tokens = len(ids)
        if prompt_tokens == 0:
            # vLLM refuses it ("The decoder prompt cannot be empty"); "" that the tokenizer
            # turns into a BOS token is a prompt, as vLLM takes it.
            name = "prompt" if isinstance(body.prompt, str) else f"prompt[{i}]"
            raise InvalidRequestError(
                f"{name} is empty: it has no tokens for the model; send some text",
                param="prompt",
            )
        # max_tokens=0 echoes the prompt alone; vLLM's engine still generates one token.
        requested = 1 if body.max_tokens == 0 else body.max_tokens
        max_tokens = resolve_max_tokens(
            _default_max_tokens(state, requested, prompt_tokens),
            prompt_tokens,
            state.settings.max_model_len,
            "max_tokens",
            prompt_field="prompt",
        )
        sampling = build_sampling(
            body,
            max_tokens=max_tokens,
            logprobs=body.logprobs,
            structured=structured,
            vocab_size=state.tokenizer.get_vocab_size(),
        )
        if body.echo and body.logprobs is not None:
            sampling["prompt_logprobs"] = max(body.logprobs, body.prompt_logprobs or 0)
        samplings.append(sampling)
        first_id = ids[0] if body.logprobs is not None else None
        echoes.append(
            _Echo.of(state, prompt, body.max_tokens == 0, first_id) if body.echo else None
        )
    return _Prepared(prompts, all_ids, samplings, echoes, requirement)


async def _check_echo(state: FrontendState, body: CompletionRequest) -> None:
    if body.echo and body.logprobs is not None:
        reason = await state.engine.returns_prompt_logprobs()
        if reason is not None:
            raise FieldRefusedError(
                "echo", f"echo with logprobs needs the prompt's log-probabilities: {reason}"
            )


@router.post(
    ROUTE,
    responses=error_responses(
        *(400, 401, 404, 413, 429, 501, 502, 503, 504), descriptions={501: NOT_GENERATING}
    ),
)
async def create_completion(
    body: CompletionRequest, request: Request, _: AuthDep, state: StateDep
) -> Any:
    """Create a text completion; every field follows the field table (docs/frontend-fields.md)."""
    prepared = _prepare(state, body)
    await _check_echo(state, body)
    n = body.n or 1
    rid = new_id("cmpl", body.request_id)
    want_logprobs = body.logprobs is not None
    top = body.logprobs or 0
    stream = bool(body.stream)
    params = [
        GenerateParams(p, s, stream, "logprobs" in s, f"{rid}-{i}", body.cache_salt)
        for i, (p, s) in enumerate(zip(prepared.prompts, prepared.samplings, strict=True))
    ]
    if stream:
        report = UsageReport.of(body.stream_options)
        return await sse_response(
            state, _events(state, body, rid, prepared, params, n, report, top)
        )

    results = await run_until_disconnect(
        request,
        gather_or_cancel(collect(state.engine, p, n) for p in params),
        state.settings.request_timeout_s,
    )
    choices = []
    prompt_tokens = completion_tokens = 0
    names = state.token_names.for_request(body.return_tokens_as_token_ids)
    stop = stop_field(body.stop, body.stop_token_ids)
    for p_index, generation in enumerate(results):
        prompt_tokens += generation.prompt_tokens
        echo = prepared.echoes[p_index]
        for c_index, c in enumerate(generation.choices):
            index = p_index * n + c_index
            if prepared.requirement is not None:
                validated_output(
                    state, ROUTE, prepared.requirement, c.text, index, c.finish_reason, stop
                )
            completion_tokens += c.tokens
            text = c.text
            entries: Sequence[TokenLogprob | _Unscored] = c.logprobs
            if echo is not None:
                positions = generation.prompt_logprobs
                text, entries = echo.apply(c.text, c.logprobs, positions, want_logprobs)
            choice: dict[str, Any] = {
                "index": index,
                "text": text,
                "logprobs": _logprobs(entries, top, 0, names) if want_logprobs else None,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
            if body.return_token_ids:
                choice["prompt_token_ids"] = prepared.prompt_ids[p_index]
                choice["token_ids"] = [t.token_id for t in c.logprobs]
            if body.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs_field(
                    generation.prompt_logprobs, body.prompt_logprobs, names
                )
            choices.append(choice)
    # A Response skips FastAPI's jsonable_encoder pass over the dict (per-request cost).
    return JSONResponse(
        {
            **envelope(rid, "text_completion", now(), body.model, choices),
            "usage": usage(
                prompt_tokens, completion_tokens, _summed(g.cached_tokens for g in results)
            ),
        }
    )


class _PromptChoices:
    """What a stream has sent of one prompt's ``n`` choices, to turn its outputs into deltas."""

    def __init__(
        self,
        index: int,
        n: int,
        echo: _Echo | None,
        top: int | None,
        names: TokenNames,
        validate: Callable[[str, int, str | None], None] | None,
        prompt_ids: list[int] | None,
    ) -> None:
        """``prompt_ids`` (with ``return_token_ids``) go on each choice's first chunk, and every
        chunk then carries its tokens' ids."""
        self.index = index
        self.n = n
        self.echo = echo
        self.top = top
        self.names = names
        self.validate = validate
        # Each choice's generated text so far, for ``validate`` when it ends.
        self.texts = [""] * n if validate is not None else []
        self.echoed = [echo is None] * n
        self.prompt_ids = prompt_ids
        self.started = [False] * n
        self.done = [False] * n
        self.offsets = [0] * n
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens: int | None = None
        self.positions: tuple[TokenLogprob | None, ...] | None = None

    def deltas(self, output: EngineOutput) -> list[dict[str, Any]]:
        """The chunk choices for ``output``; each keeps its index ``prompt_index * n + index``."""
        self.prompt_tokens = output.prompt_tokens or self.prompt_tokens
        if output.cached_tokens is not None:
            self.cached_tokens = output.cached_tokens
        self.positions = self.positions or output.prompt_logprobs
        deltas = []
        for c in output.choices:
            if self.done[c.index]:
                continue
            self.completion_tokens += c.num_tokens
            index = self.index * self.n + c.index
            if self.validate is not None:
                self.texts[c.index] += c.text
                if c.finish_reason is not None:
                    # Before the chunk that carries the finish_reason: failed output ends the
                    # stream with an error event instead, as on chat completions.
                    self.validate(self.texts[c.index], index, c.finish_reason)
            text = c.text
            entries: Sequence[TokenLogprob | _Unscored] = c.logprobs
            if self.echo is not None:
                if not self.echoed[c.index]:
                    self.echoed[c.index] = True
                    text, entries = self.echo.apply(
                        c.text, c.logprobs, self.positions, self.top is not None
                    )
                elif self.echo.only:
                    text, entries = "", []
            self.done[c.index] = c.finish_reason is not None
            delta = {
                "index": index,
                "text": text,
                "logprobs": _logprobs(entries, self.top, self.offsets[c.index], self.names)
                if self.top is not None
                else None,
                "finish_reason": c.finish_reason,
            }
            if c.finish_reason is not None:
                delta["stop_reason"] = c.stop_reason
            if self.prompt_ids is not None:
                if not self.started[c.index]:
                    self.started[c.index] = True
                    delta["prompt_token_ids"] = self.prompt_ids
                delta["token_ids"] = [t.token_id for t in c.logprobs]
            deltas.append(delta)
            self.offsets[c.index] += len(text)
        return deltas


async def _events(
    state: FrontendState,
    body: CompletionRequest,
    rid: str,
    prepared: _Prepared,
    params: list[GenerateParams],
    n: int,
    report: UsageReport,
    top: int,
) -> AsyncGenerator[bytes | dict[str, Any], None]:
    created = now()
    frame = ChunkFrame(rid, "text_completion", created, body.model, report.final)
    names = state.token_names.for_request(body.return_tokens_as_token_ids)
    requirement = prepared.requirement
    stop = stop_field(body.stop, body.stop_token_ids)
    validate = (
        partial(validated_output, state, ROUTE, requirement, stop=stop)
        if requirement is not None
        else None
    )
    sent = [
        _PromptChoices(
            i,
            n,
            echo,
            top if body.logprobs is not None else None,
            names,
            validate,
            ids if body.return_token_ids else None,
        )
        for i, (echo, ids) in enumerate(zip(prepared.echoes, prepared.prompt_ids, strict=True))
    ]
    # Prompts stream at once, their chunks interleaved as they come. Closed here, not left to
    # the garbage collector, so every prompt's backend request ends now.
    streams = [stream_outputs(state.engine, p) for p in params]
    async with aclosing(merge_streams(streams, state.closing_tasks)) as outputs:
        async for p_index, output in outputs:
            deltas = sent[p_index].deltas(output)
            if deltas:
                yield frame.encode(deltas, _usage(sent) if report.continuous else None)
    if report.final:
        final = envelope(rid, "text_completion", created, body.model, [])
        final["usage"] = _usage(sent)
        yield final


def _usage(sent: list[_PromptChoices]) -> dict[str, Any]:
    """The request's usage so far, over every prompt."""
    return usage(
        sum(s.prompt_tokens for s in sent),
        sum(s.completion_tokens for s in sent),
        _summed(s.cached_tokens for s in sent),
    )


def _summed(counts: Iterable[int | None]) -> int | None:
    """The prompts' cached tokens, once the backend has counted every prompt's."""
    known = list(counts)
    return None if None in known else sum(c for c in known if c is not None)
