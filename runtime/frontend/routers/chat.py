"""``POST /v1/chat/completions``: chat template, sampling, structured outputs, tool calls."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from runtime.frontend.chat_template import ChatTemplate, ChatTemplateError, cut_after_final_message
from runtime.frontend.dependencies import AuthDep, StateDep, check_model
from runtime.frontend.engine import GenerateParams, TokenLogprob
from runtime.frontend.errors import (
    NOT_GENERATING,
    FieldRefusedError,
    InvalidRequestError,
    error_responses,
)
from runtime.frontend.fields import check_fields
from runtime.frontend.generation import (
    ChunkFrame,
    UsageReport,
    collect,
    counted_invalid_output,
    envelope,
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
from runtime.frontend.schemas import (
    AssistantToolCall,
    ChatCompletionRequest,
    ChatMessage,
    TokenizeRequest,
)
from runtime.frontend.state import FrontendState
from runtime.frontend.streaming import run_until_disconnect, sse_response
from runtime.frontend.structured import (
    OutputRequirement,
    requirement_for,
    structured_outputs_value,
)
from runtime.frontend.token_names import TokenNames
from runtime.frontend.tool_parsers import ToolDelta, ToolStream, tool_stream
from runtime.frontend.tools import ToolPlan, plan_tools

__all__ = ["ROUTE", "render_prompt", "router"]

ROUTE = "/v1/chat/completions"
router = APIRouter(tags=["chat"])


def _replayed_call(call: AssistantToolCall, where: str) -> dict[str, Any]:
    """A replayed tool call with its ``arguments`` parsed, as vLLM's chat_utils parses them.

    Templates written for transformers read arguments as a mapping (``arguments | tojson``);
    empty or ``null`` arguments become ``{}``, and any other JSON value is kept as parsed.
    """
    item = call.model_dump()
    text = call.function.arguments
    try:
        parsed = json.loads(text) if text else None
    except (ValueError, RecursionError) as exc:
        raise InvalidRequestError(
            f"{where} is not JSON ({exc}); send the arguments as the JSON text the model "
            "wrote, as the API returned them",
            param=where,
        ) from None
    item["function"]["arguments"] = {} if parsed is None else parsed
    return item


# Fields of a response message that SDKs replay (message.model_dump()) and that the model's
# template cannot render: null or empty is accepted as carrying nothing.
_UNREPLAYABLE = (
    ("annotations", "annotations (URL citations) cannot be replayed to the model; send null"),
    ("audio", "audio output is not supported, so there is none to replay; send null"),
    ("function_call", "deprecated; replay calls as tool_calls, or send null"),
)


def _check_content(m: ChatMessage, where: str) -> None:
    """Refuse content the template would render as something else than was sent: none on a
    turn that OpenAI requires it on (all but assistant turns), or a non-text part."""
    if m.content is None and m.role != "assistant":
        raise InvalidRequestError(
            f"{where}.content is required on a {m.role} message; send its text",
            param=f"{where}.content",
            code="missing_required_parameter",
        )
    if isinstance(m.content, str) or m.content is None:
        return
    for j, part in enumerate(m.content):
        at = f"{where}.content[{j}]"
        if part.type != "text":
            raise FieldRefusedError(
                at,
                f"content parts of type '{part.type}' are not supported: this model reads text "
                'only; send {"type": "text", "text": ...} parts',
            )
        if part.text is None:
            raise InvalidRequestError(f"{at} is a text part without text", param=f"{at}.text")
        unknown = next(iter(part.model_extra or {}), None)
        if unknown is not None:
            raise FieldRefusedError(f"{at}.{unknown}", "not a field of a text part (unknown field)")


def _template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages):
        if m.refusal is not None:
            raise FieldRefusedError(
                f"messages[{i}].refusal", "a refusal cannot be replayed to the model; send null"
            )
        for name, why in _UNREPLAYABLE:
            if getattr(m, name):
                raise FieldRefusedError(f"messages[{i}].{name}", why)
        # vLLM's chat parser keeps tool_calls on assistant turns only and tool_call_id on
        # tool turns only; dropping them silently would hide a client bug.
        if m.tool_calls and m.role != "assistant":
            raise FieldRefusedError(
                f"messages[{i}].tool_calls",
                "only assistant messages carry tool_calls; send them on the assistant turn "
                "that made the calls",
            )
        if m.tool_call_id is not None and m.role != "tool":
            raise FieldRefusedError(
                f"messages[{i}].tool_call_id",
                'only tool messages carry tool_call_id; send it on the {"role": "tool"} '
                "message that answers the call",
            )
        _check_content(m, f"messages[{i}]")
        # Templates know system, user, assistant and tool; developer is the newer system.
        item: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role}
        item["content"] = m.text()
        if m.name is not None:
            item["name"] = m.name
        # An empty list is left out, as vLLM does, so templates take the plain assistant path.
        if m.tool_calls:
            item["tool_calls"] = [
                _replayed_call(call, f"messages[{i}].tool_calls[{j}].function.arguments")
                for j, call in enumerate(m.tool_calls)
            ]
        if m.tool_call_id is not None:
            item["tool_call_id"] = m.tool_call_id
        out.append(item)
    return out


def _logprob(names: TokenNames, entry: TokenLogprob) -> dict[str, Any]:
    token, raw = names.name(entry.token_id, entry.token)
    return {"token": token, "logprob": openai_logprob(entry.logprob), "bytes": list(raw)}


def _logprobs(
    items: list[TokenLogprob] | tuple[TokenLogprob, ...], top: int, names: TokenNames
) -> dict[str, Any]:
    return {
        "content": [
            {**_logprob(names, t), "top_logprobs": [_logprob(names, e) for e in t.top[:top]]}
            for t in items
        ],
        "refusal": None,
    }


def _check(state: FrontendState, body: ChatCompletionRequest) -> None:
    check_fields(ROUTE, body)
    check_model(state.settings, body.model)
    if (
        body.max_tokens is not None
        and body.max_completion_tokens is not None
        and body.max_tokens != body.max_completion_tokens
    ):
        raise InvalidRequestError(
            "max_tokens and max_completion_tokens differ; send one of them",
            param="max_completion_tokens",
        )
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequestError("top_logprobs requires logprobs=true", param="top_logprobs")
    check_logprobs(body.top_logprobs, state.settings.max_logprobs, "top_logprobs")
    check_logprobs(body.prompt_logprobs, state.settings.max_logprobs, "prompt_logprobs")
    if body.stream_options is not None and not body.stream:
        raise InvalidRequestError("stream_options requires stream=true", param="stream_options")


# TruncatedOutputError is a 400 too: the client's max_tokens or stop broke the format it asked for.
_INVALID = (
    "Invalid request: a refused field or value (param names it), a body that is not JSON, or "
    "output that max_tokens or a stop sequence cut before it met response_format or finished a "
    "tool call"
)


def render_prompt(
    state: FrontendState,
    body: ChatCompletionRequest | TokenizeRequest,
    tools: list[dict[str, Any]] | None,
) -> str:
    """The prompt text the engine gets for ``body``'s conversation (``/tokenize`` counts it)."""
    continuing = bool(body.continue_final_message)
    if continuing and body.add_generation_prompt:
        raise InvalidRequestError(
            "continue_final_message continues the last message and add_generation_prompt starts "
            "a new one; send add_generation_prompt false, or leave it out",
            param="continue_final_message",
        )
    rendered = _template_messages(body.messages or [])
    try:
        prompt = state.template.render(
            rendered,
            tools,
            strip_bos=state.adds_bos,
            add_generation_prompt=not continuing and body.add_generation_prompt is not False,
            kwargs=_template_kwargs(state.template, body.chat_template_kwargs),
        )
    except ChatTemplateError as exc:
        raise InvalidRequestError(str(exc), param="messages") from None
    if not continuing:
        return prompt
    try:
        return cut_after_final_message(prompt, rendered[-1].get("content") or "")
    except ChatTemplateError as exc:
        raise InvalidRequestError(
            f"continue_final_message: {exc}", param="continue_final_message"
        ) from None


def _template_kwargs(template: ChatTemplate, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The client's template variables, each one the template reads and none it is given."""
    for key in kwargs or {}:
        if key in template.reserved:
            raise InvalidRequestError(
                f"chat_template_kwargs.{key} is set by the frontend itself (send the request's "
                "own field, or leave it out)",
                param="chat_template_kwargs",
            )
        if key not in template.reads:
            readable = sorted(template.reads - template.reserved)
            raise InvalidRequestError(
                f"chat_template_kwargs.{key} is not read by the model's chat template, so it "
                f"would change nothing; the template reads {readable or 'no other variables'}",
                param="chat_template_kwargs",
            )
    return kwargs or {}


@router.post(
    ROUTE,
    responses=error_responses(
        *(400, 401, 404, 413, 429, 501, 502, 503, 504),
        descriptions={400: _INVALID, 501: NOT_GENERATING},
    ),
)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, _: AuthDep, state: StateDep
) -> Any:
    """Create a chat completion; every field follows the field table (docs/frontend-fields.md)."""
    _check(state, body)
    stream = bool(body.stream)
    plan = plan_tools(
        body.tools,
        body.tool_choice,
        state.settings.tool_call_parser,
        parallel=body.parallel_tool_calls is not False,
    )
    requirement = requirement_for(body.response_format, body.structured_outputs)
    if plan.forced is not None and requirement is not None:
        field = "response_format" if body.structured_outputs is None else "structured_outputs"
        raise InvalidRequestError(
            f"{field} and a required tool_choice both constrain the output; send one",
            param=field,
        )
    prompt = render_prompt(state, body, plan.template_tools)
    prompt_ids = state.prompt_ids(prompt)
    max_tokens = resolve_max_tokens(
        body.max_completion_tokens or body.max_tokens,
        len(prompt_ids),
        state.settings.max_model_len,
        "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens",
        prompt_field="messages",
    )
    spec = requirement.spec() if requirement else None
    if plan.forced is not None:
        spec = {"json": plan.forced}
    structured = (state.structured_key, structured_outputs_value(spec)) if spec else None
    top = body.top_logprobs or 0
    logprobs = top if body.logprobs else None
    sampling = build_sampling(
        body,
        max_tokens=max_tokens,
        logprobs=logprobs,
        structured=structured,
        vocab_size=state.tokenizer.get_vocab_size(),
    )
    if plan.template_tools is not None:
        # As vLLM's tool parsers ask (hermes' adjust_request): some tokenizers mark the
        # tool-call markers special, and detokenizing would drop them before the parser runs.
        if body.skip_special_tokens:
            raise InvalidRequestError(
                "skip_special_tokens=true would drop the tool-call markers that a tokenizer "
                "marks special before the tool-call parser reads them; leave it out beside "
                "tools, or send tool_choice none",
                param="skip_special_tokens",
            )
        sampling["skip_special_tokens"] = False
    request_id = new_id("chatcmpl", body.request_id)
    params = GenerateParams(
        prompt, sampling, stream, "logprobs" in sampling, request_id, body.cache_salt
    )
    n = body.n or 1
    if stream:
        report = UsageReport.of(body.stream_options)
        ids = prompt_ids if body.return_token_ids else None
        events = _events(state, body, params, n, requirement, plan, report, top, ids)
        return await sse_response(state, events)
    generation = await run_until_disconnect(
        request, collect(state.engine, params, n), state.settings.request_timeout_s
    )
    choices, prompt_tokens = generation.choices, generation.prompt_tokens
    names = state.token_names.for_request(body.return_tokens_as_token_ids)
    stop = stop_field(body.stop, body.stop_token_ids)
    out = []
    for i, c in enumerate(choices):
        if requirement is not None:
            validated_output(state, ROUTE, requirement, c.text, i, c.finish_reason, stop)
        message, finish = _message(state, plan, c.text, c.finish_reason, i, stop)
        out.append(
            {
                "index": i,
                "message": message,
                "logprobs": _logprobs(c.logprobs, top, names) if logprobs is not None else None,
                "finish_reason": finish,
                "stop_reason": c.stop_reason,
            }
        )
        if body.return_token_ids:
            out[-1]["token_ids"] = [t.token_id for t in c.logprobs]
    completion_tokens = sum(c.tokens for c in choices)
    reply = {
        **envelope(params.request_id, "chat.completion", now(), body.model, out),
        "usage": usage(prompt_tokens, completion_tokens, generation.cached_tokens),
    }
    if body.return_token_ids:
        reply["prompt_token_ids"] = prompt_ids
    if body.prompt_logprobs is not None:
        reply["prompt_logprobs"] = prompt_logprobs_field(
            generation.prompt_logprobs, body.prompt_logprobs, names
        )
    # A Response skips FastAPI's jsonable_encoder pass over the dict (per-request cost).
    return JSONResponse(reply)


def _parsed(
    state: FrontendState,
    parser: ToolStream,
    text: str,
    finish: str | None,
    index: int,
    stop: str | None,
) -> ToolDelta:
    """Feed a choice's new text (and its end) to its tool-call parser.

    Output that breaks the tool-call format is counted, then raised; ``stop`` names the
    request's stop sequences, blamed only for a forced call's unfinished JSON
    (:func:`counted_invalid_output`).
    """
    with counted_invalid_output(state, ROUTE, index, finish, stop):
        piece = parser.feed(text)
        if finish is not None:
            piece.extend(parser.finish(finish))
        return piece


def _message(
    state: FrontendState,
    plan: ToolPlan,
    text: str,
    finish: str | None,
    index: int,
    stop: str | None,
) -> tuple[dict[str, Any], str | None]:
    parser = tool_stream(plan)
    if parser is None:
        return {"role": "assistant", "content": text}, finish
    _parsed(state, parser, text, finish, index, stop)
    if not parser.calls:
        return {"role": "assistant", "content": text}, finish
    message: dict[str, Any] = {"role": "assistant", "content": parser.content}
    message["tool_calls"] = [c.as_openai() for c in parser.calls]
    return message, "tool_calls"


async def _events(
    state: FrontendState,
    body: ChatCompletionRequest,
    params: GenerateParams,
    n: int,
    requirement: OutputRequirement | None,
    plan: ToolPlan,
    report: UsageReport,
    top: int,
    prompt_ids: list[int] | None,
) -> AsyncGenerator[bytes | dict[str, Any], None]:
    """The stream's chunks; ``prompt_ids`` (with ``return_token_ids``) go on the first, and
    every choice then carries its tokens' ids."""
    created = now()
    names = state.token_names.for_request(body.return_tokens_as_token_ids)
    texts = [""] * n
    started = [False] * n
    done = [False] * n
    parsers = [tool_stream(plan) for _ in range(n)]
    stop = stop_field(body.stop, body.stop_token_ids)
    prompt_tokens = completion_tokens = 0
    cached_tokens: int | None = None
    kind = "chat.completion.chunk"
    frame = ChunkFrame(params.request_id, kind, created, body.model, report.final)

    # Closed here, not left to the garbage collector, so the backend request ends now.
    async with aclosing(stream_outputs(state.engine, params)) as outputs:
        async for output in outputs:
            prompt_tokens = output.prompt_tokens or prompt_tokens
            if output.cached_tokens is not None:
                cached_tokens = output.cached_tokens
            deltas = []
            for c in output.choices:
                if done[c.index]:
                    continue
                completion_tokens += c.num_tokens
                texts[c.index] += c.text
                finish = c.finish_reason
                if finish is not None:
                    done[c.index] = True
                    if requirement is not None:
                        validated_output(
                            state, ROUTE, requirement, texts[c.index], c.index, finish, stop
                        )
                parser = parsers[c.index]
                if parser is None:
                    delta: dict[str, Any] = {"content": c.text}
                else:
                    piece = _parsed(state, parser, c.text, finish, c.index, stop)
                    delta = {}
                    if piece.content:
                        delta["content"] = piece.content
                    if piece.calls:
                        delta["tool_calls"] = [d.as_openai() for d in piece.calls]
                    if finish is not None and parser.calls:
                        finish = "tool_calls"
                    # Held-back text makes some outputs say nothing yet; they carry no chunk
                    # unless their tokens' log-probabilities or ids must go out.
                    if not delta and finish is None and not params.logprobs:
                        continue
                if not started[c.index]:
                    started[c.index] = True
                    delta["role"] = "assistant"
                choice = {
                    "index": c.index,
                    "delta": delta,
                    "logprobs": _logprobs(c.logprobs, top, names) if body.logprobs else None,
                    "finish_reason": finish,
                }
                if finish is not None:
                    choice["stop_reason"] = c.stop_reason
                if body.return_token_ids:
                    choice["token_ids"] = [t.token_id for t in c.logprobs]
                deltas.append(choice)
            if deltas:
                so_far = (
                    usage(prompt_tokens, completion_tokens, cached_tokens)
                    if report.continuous
                    else None
                )
                first = {"prompt_token_ids": prompt_ids} if prompt_ids is not None else None
                prompt_ids = None
                yield frame.encode(deltas, so_far, first)
    if report.final:
        final = envelope(params.request_id, kind, created, body.model, [])
        final["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        yield final
