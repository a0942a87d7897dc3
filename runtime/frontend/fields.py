"""The field table: every request field of every route is honoured, inert or refused.

Each row says what the frontend does with the field; ``refuse`` returns the reason a given value
cannot be honoured (``None`` when it can). :func:`check_fields` runs the table over a parsed
request; ``docs/frontend-fields.md`` is generated from these rows (:func:`render_markdown`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from runtime.frontend.errors import FieldRefusedError

__all__ = [
    "TABLES",
    "FieldRule",
    "Policy",
    "check_fields",
    "render_markdown",
]


class Policy(StrEnum):
    HONOURED = "honoured"
    INERT = "inert"
    REFUSED = "refused"


Refuse = Callable[[Any], str | None]


@dataclass(frozen=True)
class FieldRule:
    """One row: the field, its policy, what happens to it, and which values are refused."""

    field: str
    policy: Policy
    effect: str
    refuse: Refuse | None = None


def _always(reason: str) -> Refuse:
    return lambda value: reason


def _unless(allowed: tuple[Any, ...], reason: str) -> Refuse:
    return lambda value: None if value in allowed else reason


def _modalities(value: list[str]) -> str | None:
    return None if value == ["text"] else 'only text output is produced; send ["text"]'


def _stream_options(value: Any) -> str | None:
    if value.include_obfuscation:
        return "stream_options.include_obfuscation is not implemented; send false"
    if value.continuous_usage_stats and not value.include_usage:
        return (
            "stream_options.continuous_usage_stats adds usage to every chunk of a stream that "
            "reports usage; send include_usage true with it"
        )
    return None


def _prompt(value: Any) -> str | None:
    if isinstance(value, list) and not value:
        return "the list is empty; send at least one text"
    return None


_MODEL = FieldRule("model", Policy.HONOURED, "must name the served model; otherwise 404")

_SAMPLING = (
    _MODEL,
    FieldRule("frequency_penalty", Policy.HONOURED, "sampling_parameters.frequency_penalty"),
    FieldRule("presence_penalty", Policy.HONOURED, "sampling_parameters.presence_penalty"),
    FieldRule(
        "logit_bias",
        Policy.HONOURED,
        "sampling_parameters.logit_bias; keys must be token ids of the model's vocabulary and "
        "values lie in [-100, 100], anything else is a 400",
    ),
    FieldRule("max_tokens", Policy.HONOURED, "sampling_parameters.max_tokens"),
    FieldRule(
        "n",
        Policy.HONOURED,
        "sampling_parameters.n; one choice per output; n above 1 with temperature 0 (greedy) "
        "is a 400, as in vLLM",
    ),
    FieldRule("seed", Policy.HONOURED, "sampling_parameters.seed"),
    FieldRule(
        "stop",
        Policy.HONOURED,
        "sampling_parameters.stop; an empty stop string is a 400, as in vLLM; as in vLLM's "
        "server each finished choice carries stop_reason, the stop string or stop token id "
        "that ended it (null otherwise, and always null against the stock backend); beside "
        "response_format, structured_outputs json, json_object or choice, or a forced tool "
        "call, output that stops unfinished (JSON that does not parse, part of a choice) is a "
        "400 output_stopped (param stop), as the engine ends such output only once complete; "
        "regex and grammar output is returned as the engine ends it",
    ),
    FieldRule("stream", Policy.HONOURED, "server-sent events; backend tensor stream=true"),
    FieldRule(
        "stream_options",
        Policy.HONOURED,
        "include_usage adds the usage chunk; with it, continuous_usage_stats (an extension, as in "
        "vLLM's server) adds the request's usage so far to every chunk (over all its choices "
        "and prompts; vLLM counts the chunk's choice); include_obfuscation=true is refused",
        _stream_options,
    ),
    FieldRule(
        "stream_interval",
        Policy.HONOURED,
        "extension, as in vLLM's server: sampling_parameters.stream_interval; a streamed chunk "
        "carries up to this many tokens (the first token at once), raised to the engine's "
        "stream_interval if that is larger; a 400 against the stock Triton backend, which "
        "ignores it",
    ),
    FieldRule("temperature", Policy.HONOURED, "sampling_parameters.temperature"),
    FieldRule("top_p", Policy.HONOURED, "sampling_parameters.top_p"),
    FieldRule("user", Policy.INERT, "no effect on output; never logged"),
    FieldRule(
        "constraints",
        Policy.HONOURED,
        "extension: validated by runtime.constraints.schema (catalog names and item ids "
        "against LLM_SERVING_CATALOG_DIR when set), sent as "
        "sampling_parameters.extra_args.constraints; a 400 beside structured_outputs, "
        "response_format json_object or json_schema, or a tool_choice that forces a call (the "
        "engine refuses the pair)",
    ),
    FieldRule(
        "top_k", Policy.HONOURED, "extension, as in vLLM's server: sampling_parameters.top_k"
    ),
    FieldRule(
        "min_p", Policy.HONOURED, "extension, as in vLLM's server: sampling_parameters.min_p"
    ),
    FieldRule(
        "repetition_penalty",
        Policy.HONOURED,
        "extension, as in vLLM's server: sampling_parameters.repetition_penalty; must be above 0",
    ),
    FieldRule(
        "min_tokens",
        Policy.HONOURED,
        "extension, as in vLLM's server: sampling_parameters.min_tokens; more than the request's "
        "max_tokens, or beside constraints or structured outputs, is a 400",
    ),
    FieldRule(
        "stop_token_ids",
        Policy.HONOURED,
        "extension, as in vLLM's server: sampling_parameters.stop_token_ids; ids outside the "
        "model's vocabulary are a 400; constrained output they leave unfinished is a 400 "
        "output_stopped, as for stop",
    ),
    FieldRule(
        "ignore_eos",
        Policy.HONOURED,
        "extension, as in vLLM's server: sampling_parameters.ignore_eos; a 400 beside "
        "constraints or structured outputs",
    ),
    FieldRule(
        "include_stop_str_in_output",
        Policy.HONOURED,
        "extension, as in vLLM's server: sampling_parameters.include_stop_str_in_output",
    ),
    FieldRule(
        "allowed_token_ids",
        Policy.HONOURED,
        "extension, as in vLLM's server: sampling_parameters.allowed_token_ids; an empty list or "
        "ids outside the model's vocabulary are a 400, and so is the field beside constraints or "
        "structured outputs",
    ),
    FieldRule(
        "bad_words",
        Policy.HONOURED,
        "extension, as in vLLM's server: sampling_parameters.bad_words; an empty word, or the "
        "field beside constraints or structured outputs, is a 400",
    ),
    FieldRule(
        "skip_special_tokens",
        Policy.HONOURED,
        "extension, as in vLLM's server: sampling_parameters.skip_special_tokens (default true: "
        "special tokens are left out of the text); on chat completions with tools, unless "
        "tool_choice is none, true is a 400 (the tool-call parser needs the markers)",
    ),
    FieldRule(
        "spaces_between_special_tokens",
        Policy.HONOURED,
        "extension, as in vLLM's server: sampling_parameters.spaces_between_special_tokens; as "
        "in vLLM it changes only the text of slow (Python) tokenizers",
    ),
    FieldRule(
        "return_token_ids",
        Policy.HONOURED,
        "extension, as in vLLM's server: the response carries prompt_token_ids (on each choice "
        "of text completions, once for chat; the frontend's tokenization of the prompt, whose "
        "count is usage.prompt_tokens) and each choice's token_ids (from the engine: the "
        "frontend asks for sampling_parameters.logprobs, at least 0, whose entries are keyed by "
        "token id); streamed as in vLLM, each chunk's choice carries its tokens' token_ids "
        "and the prompt_token_ids come once (on each choice's first chunk of text completions, "
        "on chat's first chunk)",
    ),
    FieldRule(
        "request_id",
        Policy.HONOURED,
        "extension, as in vLLM's server: the response's id is chatcmpl- or cmpl- and this id, "
        "and Triton's request id is the same (text completions add -N per prompt); 1 to 128 of "
        "A-Z a-z 0-9 . _ : -, else a 400; unlike vLLM's server, an X-Request-Id header does not "
        "replace it (that header names the request in the access log)",
    ),
    FieldRule(
        "cache_salt",
        Policy.HONOURED,
        "extension, as in vLLM's server: a non-empty string (else a 400) that the "
        "llm_serving_vllm backend gives vLLM with the prompt, so that only requests with the "
        "same salt share prefix-cached blocks (one salt per tenant keeps another tenant from "
        "timing its prompts against the cache); sent as Triton's cache_salt request parameter; "
        "a 400 against the stock backend, which would drop it",
    ),
    FieldRule(
        "prompt_logprobs",
        Policy.HONOURED,
        "extension, as in vLLM's server: sampling_parameters.prompt_logprobs; the response "
        "carries prompt_logprobs (on each choice of text completions, once for chat), per prompt "
        "token null for the first, else {token_id: {logprob, rank, decoded_token}} for that token "
        "and the most likely ones; above the engine's max_logprobs, with stream (as in vLLM), or "
        "against the stock Triton backend (which returns none) a 400",
    ),
    FieldRule(
        "return_tokens_as_token_ids",
        Policy.HONOURED,
        "extension, as in vLLM's server: logprobs name each token token_id:N (its bytes stay the "
        "token's own, where vLLM sends those of the name); without logprobs a 400",
    ),
    FieldRule(
        "priority",
        Policy.INERT,
        "extension, as in vLLM's server: 0 only, as vLLM's default first-come-first-served "
        "scheduling takes it (Triton's vLLM backend passes no priority); other values are "
        "refused",
        _unless((0,), "the engine schedules first come, first served; send 0 or leave it out"),
    ),
    FieldRule(
        "structured_outputs",
        Policy.HONOURED,
        "extension, as in vLLM's server: exactly one of json (a JSON Schema, as an object or as "
        "JSON text), json_object (true), regex, choice (non-empty strings) or grammar, sent as "
        "the structured_outputs sampling parameter under the pinned key; json and json_object "
        "output is validated as chat's response_format is, choice output must be one of the "
        "choices (else a 502 invalid_choice_output; cut by max_tokens, a 400 output_truncated), "
        "with the same streamed error event; regex and grammar are compiled and enforced by the "
        "engine alone (one it cannot compile is a 400 engine_refused from the llm_serving_vllm "
        "backend) and returned as it ends them; vLLM's other keys (whitespace, "
        "additionalProperties, structural_tag) are refused; a 400 beside response_format, a "
        "tool_choice that forces a call, or constraints",
    ),
)

CHAT_FIELDS: tuple[FieldRule, ...] = (
    FieldRule(
        "messages",
        Policy.HONOURED,
        "rendered with the model's own chat template (developer becomes system; content is "
        "required except on assistant turns; text parts are joined, a part of another type "
        "(image, audio, file) is a 400 naming it; a non-null refusal, annotations, audio or "
        "function_call is refused, null accepted as an SDK's message.model_dump() replays it; "
        "replayed tool_calls are {id, type function, function {name, arguments}}, arguments "
        "parsed from JSON as vLLM does: empty or null become {}, text that is not JSON is a 400 "
        "naming it, an empty tool_calls list is left out; tool_calls on a turn other than "
        "assistant, or tool_call_id on a turn other than tool, is a 400 naming it, where vLLM "
        "would drop it); a BOS the template writes first is left out when the tokenizer adds its "
        "own; a template that fails to render them is a 400",
    ),
    *_SAMPLING,
    FieldRule("audio", Policy.REFUSED, "", _always("audio output is not supported")),
    FieldRule(
        "function_call", Policy.REFUSED, "", _always("deprecated; use tools and tool_choice")
    ),
    FieldRule("functions", Policy.REFUSED, "", _always("deprecated; use tools and tool_choice")),
    FieldRule(
        "logprobs",
        Policy.HONOURED,
        "sampling_parameters.logprobs; return_logprobs; each token's bytes are the tokenizer's, "
        "and a token that is not UTF-8 on its own is named by them (bytes:\\xNN...), so "
        "distinct tokens keep distinct names",
    ),
    FieldRule(
        "top_logprobs",
        Policy.HONOURED,
        "sampling_parameters.logprobs = top_logprobs; above the engine's max_logprobs a 400",
    ),
    FieldRule("max_completion_tokens", Policy.HONOURED, "sampling_parameters.max_tokens"),
    FieldRule("metadata", Policy.INERT, "no effect on output (nothing is stored)"),
    FieldRule(
        "modalities", Policy.HONOURED, '["text"] only; anything else is refused', _modalities
    ),
    FieldRule(
        "parallel_tool_calls",
        Policy.HONOURED,
        "true (the default): the parser returns every call the model wrote; false: at most "
        "one call, where the output is forced (a named tool_choice makes one call; with "
        "required, the forced schema takes one), and a 400 with tool_choice auto, where the "
        "model cannot be limited (vLLM would drop the other calls); without tools it has "
        "nothing to limit",
    ),
    FieldRule("prediction", Policy.REFUSED, "", _always("predicted outputs are not supported")),
    FieldRule("prompt_cache_key", Policy.INERT, "no effect on output; prefix caching is automatic"),
    FieldRule(
        "prompt_cache_retention",
        Policy.INERT,
        '"in_memory" only (what the engine does); other values are refused',
        _unless(("in_memory",), "only in_memory prefix caching exists"),
    ),
    FieldRule(
        "reasoning_effort",
        Policy.REFUSED,
        "",
        _always("the model has no reasoning-effort control"),
    ),
    FieldRule(
        "response_format",
        Policy.HONOURED,
        "json_schema/json_object become structured outputs under the pinned key; text is "
        "plain. Without stream the JSON is validated before it is returned: output that is not "
        "JSON satisfying the format is a 502 invalid_json_output, JSON cut by max_tokens a 400 "
        "output_truncated (param max_tokens). With stream, content is sent as it is generated "
        "and each choice is validated when it ends. If it fails, every chunk of it has been "
        "sent but the one that "
        "would carry its finish_reason (and whatever last text the engine sent with that), so "
        "the client may hold all of the invalid JSON; the stream (HTTP 200 already) then ends, "
        'for every choice, with one event `data: {"error": {...}}` of the same type, param and '
        "code, without that finish_reason, a usage chunk or [DONE] (the openai client raises "
        "APIError on it). Streamed content is unvalidated until its choice's finish_reason "
        "arrives: discard it when the error event comes instead. A choice that fails before "
        "the first chunk is sent gets the HTTP error itself. A schema's $refs must resolve "
        "within it (nothing is ever fetched) and it nests at most 64 JSON levels and 32 "
        "subschemas (each $ref followed counts one); otherwise a 400",
    ),
    FieldRule("safety_identifier", Policy.INERT, "no effect on output; never logged"),
    FieldRule(
        "service_tier",
        Policy.INERT,
        '"auto" and "default" ask for nothing; other tiers are refused',
        _unless(("auto", "default"), "there is one service tier; send auto or default"),
    ),
    FieldRule(
        "store",
        Policy.INERT,
        "false only: completions are never stored",
        _unless((False,), "completions are never stored; send false or omit it"),
    ),
    FieldRule(
        "tool_choice",
        Policy.HONOURED,
        "none: no tools; auto: parsed by the model's tool-call parser; required/named: "
        "structured outputs forcing a call; each the same when streamed",
    ),
    FieldRule(
        "tools",
        Policy.HONOURED,
        "passed to the chat template; refused when no tool-call parser is configured; unless "
        "tool_choice is none, sampling_parameters.skip_special_tokens=false, as vLLM's tool "
        "parsers ask (tool-call markers that are special tokens stay in the text); with "
        "stream, calls are parsed as text arrives and sent as delta.tool_calls fragments "
        "(finish_reason tool_calls); parameters are checked as response_format schemas are; "
        "function.strict=true validates each call's arguments against its parameters before "
        "they are returned (a mismatch withholds the response: 502 invalid_tool_call, counted "
        "like invalid JSON; with stream, fragments already sent stay sent and the stream ends "
        "with that error event, as for response_format)",
    ),
    FieldRule(
        "verbosity",
        Policy.INERT,
        '"medium" (the default) only; other values are refused',
        _unless(("medium",), "the model has no verbosity control; send medium or omit it"),
    ),
    FieldRule("web_search_options", Policy.REFUSED, "", _always("web search is not available")),
    FieldRule(
        "add_generation_prompt",
        Policy.HONOURED,
        "extension, as in vLLM's server: the chat template's add_generation_prompt (default true; "
        "false when continue_final_message is true)",
    ),
    FieldRule(
        "continue_final_message",
        Policy.HONOURED,
        "extension, as in vLLM's server: the prompt ends inside the last message, cut after its "
        "text, for the model to continue; with add_generation_prompt true, or a last message "
        "with no text or one the template does not render as sent, a 400",
    ),
    FieldRule(
        "chat_template_kwargs",
        Policy.HONOURED,
        "extension, as in vLLM's server: further variables of the model's chat template (such as "
        "enable_thinking); a name the template does not read, where vLLM drops it, or one the "
        "frontend sets itself (messages, tools, add_generation_prompt, special tokens, jinja "
        "globals) is a 400",
    ),
)

COMPLETION_FIELDS: tuple[FieldRule, ...] = (
    FieldRule(
        "prompt",
        Policy.HONOURED,
        "text_input; a list is one request per prompt, all run at once (streamed too: chunks "
        "interleave, each choice's index is prompt_index * n + its index); a failed prompt "
        'cancels the others; a prompt with no tokens ("" unless the tokenizer adds a BOS) is '
        "a 400; a token-id list goes as the text the tokenizer turns back into exactly those "
        "ids, and ids no text gives (or outside the vocabulary) are a 400",
        _prompt,
    ),
    *(rule for rule in _SAMPLING if rule.field != "max_tokens"),
    FieldRule(
        "max_tokens",
        Policy.HONOURED,
        "sampling_parameters.max_tokens; default 16 (OpenAI's and vLLM's); a prompt that leaves "
        "fewer than 16 tokens of context needs an explicit max_tokens, else a 400 as in vLLM; "
        "0 with echo returns the prompt alone (the engine generates one token, counted in "
        "usage as vLLM counts it), 0 without echo is a 400",
    ),
    FieldRule(
        "best_of",
        Policy.HONOURED,
        "equal to n only (vLLM V1 has no best_of)",
        None,
    ),
    FieldRule(
        "echo",
        Policy.HONOURED,
        "the prompt is prepended to each choice's text; with logprobs also its tokens, from "
        "sampling_parameters.prompt_logprobs = logprobs (the first token's log-probability is "
        "null, as in vLLM); echo with logprobs against the stock Triton backend, which returns "
        "no prompt log-probabilities, is a 400",
    ),
    FieldRule(
        "logprobs",
        Policy.HONOURED,
        "sampling_parameters.logprobs; return_logprobs; above the engine's max_logprobs a 400; "
        "a token that is not UTF-8 on its own is named by its bytes (bytes:\\xNN...), so "
        "distinct tokens keep distinct keys",
    ),
    FieldRule("suffix", Policy.REFUSED, "", _always("fill-in-the-middle is not supported")),
    FieldRule(
        "response_format",
        Policy.HONOURED,
        "extension, as in vLLM's server: as chat's response_format (json_object and "
        "json_schema become structured outputs, the output is validated the same way, with "
        "the same streamed error event); a 400 beside structured_outputs or constraints, or "
        "with max_tokens 0",
    ),
)

EMBEDDING_FIELDS: tuple[FieldRule, ...] = (
    _MODEL,
    FieldRule(
        "input",
        Policy.HONOURED,
        "embedding_request.input, one per string, all at once; a failed one cancels the "
        "others; an input with no tokens is a 400; token-id lists go as text, as the prompt "
        "of text completions",
        _prompt,
    ),
    FieldRule(
        "dimensions",
        Policy.HONOURED,
        "embedding_request.pooling_params.dimensions; refused unless the model's config.json "
        "declares Matryoshka embeddings (is_matryoshka, or matryoshka_dimensions: only those "
        "sizes), and above its hidden_size",
    ),
    FieldRule("encoding_format", Policy.HONOURED, "float list or base64 of little-endian float32"),
    FieldRule("user", Policy.INERT, "no effect on output; never logged"),
)

SCORE_FIELDS: tuple[FieldRule, ...] = (
    _MODEL,
    FieldRule("prompt", Policy.HONOURED, "text_input prefix shared by every candidate"),
    FieldRule(
        "candidates",
        Policy.HONOURED,
        "one prefill per candidate (max_tokens=1, prompt_logprobs=0), summed over its tokens; "
        "a candidate must start at a token boundary and add a token",
    ),
    FieldRule("user", Policy.INERT, "no effect on output; never logged"),
)

_CHAT_FORM = "with messages only; rendered as chat completions render it"
TOKENIZE_FIELDS: tuple[FieldRule, ...] = (
    _MODEL,
    FieldRule(
        "prompt",
        Policy.HONOURED,
        "tokenized as text completions count it; exactly one of prompt and messages",
    ),
    FieldRule(
        "messages",
        Policy.HONOURED,
        "rendered and tokenized as chat completions send them to the engine (the count their "
        "usage reports)",
    ),
    FieldRule(
        "add_special_tokens",
        Policy.HONOURED,
        "with prompt only (default true); beside messages a 400, whose count is fixed by what "
        "chat completions send",
    ),
    FieldRule("add_generation_prompt", Policy.HONOURED, _CHAT_FORM),
    FieldRule("continue_final_message", Policy.HONOURED, _CHAT_FORM),
    FieldRule("chat_template_kwargs", Policy.HONOURED, _CHAT_FORM),
    FieldRule("tools", Policy.HONOURED, _CHAT_FORM),
    FieldRule(
        "return_token_strs", Policy.HONOURED, "adds token_strs, each token's vocabulary string"
    ),
)
DETOKENIZE_FIELDS: tuple[FieldRule, ...] = (
    _MODEL,
    FieldRule(
        "tokens",
        Policy.HONOURED,
        "decoded with special tokens written out; an id outside the vocabulary is a 400",
    ),
)

TABLES: Mapping[str, tuple[FieldRule, ...]] = {
    "/v1/chat/completions": CHAT_FIELDS,
    "/v1/completions": COMPLETION_FIELDS,
    "/v1/embeddings": EMBEDDING_FIELDS,
    "/v1/score": SCORE_FIELDS,
    "/tokenize": TOKENIZE_FIELDS,
    "/detokenize": DETOKENIZE_FIELDS,
}


def check_fields(route: str, request: BaseModel) -> None:
    """Refuse the first field whose row (or absence of a row) says it cannot be honoured."""
    rules = {rule.field: rule for rule in TABLES[route]}
    for name in request.model_fields_set:
        value = getattr(request, name)
        rule = rules.get(name)
        if rule is None:
            raise FieldRefusedError(name, "not in this route's field table")
        if value is None or rule.refuse is None:
            continue
        reason = rule.refuse(value)
        if reason is not None:
            raise FieldRefusedError(name, reason)


def render_markdown() -> str:
    """The field table as Markdown (``docs/frontend-fields.md`` is this text)."""
    lines = [
        "# OpenAI frontend: field table",
        "",
        "Generated from `runtime/frontend/fields.py` (`python -m runtime.frontend.fields`); a",
        "test keeps the two identical. Every request field is **honoured** (mapped to the",
        "engine), **inert** (no effect on output) or **refused** (HTTP 400 naming the field).",
        "A field not listed is refused the same way, and so is a string that is not UTF-8 text",
        "(a lone surrogate such as `\\ud800`).",
        "",
    ]
    for route, rules in TABLES.items():
        lines += [f"## `POST {route}`", "", "| field | policy | effect |", "| --- | --- | --- |"]
        for rule in rules:
            effect = rule.effect
            if rule.policy is Policy.REFUSED and rule.refuse is not None:
                effect = rule.refuse(object()) or ""
            lines.append(f"| `{rule.field}` | {rule.policy} | {effect} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_markdown(), end="")
