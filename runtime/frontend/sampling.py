"""The backend's ``sampling_parameters`` from the fields shared by chat and text completions."""

from __future__ import annotations

from typing import Any

from runtime.constraints.catalog import catalog_dir_from_env
from runtime.constraints.plan import check_catalog_fields
from runtime.constraints.schema import (
    ConstraintConfigError,
    check_sampling_combination,
    parse_constraints,
)
from runtime.frontend.errors import InvalidRequestError
from runtime.frontend.schemas import ChatCompletionRequest, CompletionRequest
from runtime.frontend.token_prompts import check_token_ids

__all__ = ["build_sampling", "check_logprobs", "resolve_max_tokens"]

# vLLM 0.27.1's SamplingParams raises a temperature in (0, _MAX_TEMP) to _MAX_TEMP, then takes
# one below _SAMPLING_EPS as greedy: only 0 is greedy there, and so only 0 is here.
_VLLM_SAMPLING_EPS = 1e-5
_VLLM_MAX_TEMP = 1e-2


def resolve_max_tokens(
    requested: int | None, prompt_tokens: int, max_model_len: int, field: str, *, prompt_field: str
) -> int:
    """The explicit budget (``field``), or what is left of the context; never silently shortened.

    A prompt that fills the context is blamed on ``prompt_field``, the route's own input.
    """
    room = max_model_len - prompt_tokens
    if room < 1:
        # No budget fits: the prompt itself is what must change.
        raise InvalidRequestError(
            f"the prompt is {prompt_tokens} tokens and leaves no room for output in the "
            f"model's context of {max_model_len} tokens; send a shorter prompt",
            param=prompt_field,
            code="context_length_exceeded",
        )
    if requested is None:
        return room
    if requested > room:
        raise InvalidRequestError(
            f"{field}={requested} plus the {prompt_tokens}-token prompt exceeds the model's "
            f"context of {max_model_len} tokens; send at most {room}",
            param=field,
            code="context_length_exceeded",
        )
    return requested


def check_logprobs(requested: int | None, max_logprobs: int, field: str) -> None:
    """Refuse more log-probabilities per token than the engine's ``max_logprobs`` returns.

    vLLM refuses them too, but the stock backend turns that into a failed request (a 502).
    """
    # -1 lifts vLLM's cap to the vocabulary, more than any request can ask for here.
    if requested is not None and 0 <= max_logprobs < requested:
        raise InvalidRequestError(
            f"{field}={requested} is more than this model's engine returns per token "
            f"(max_logprobs {max_logprobs}); send at most {max_logprobs}",
            param=field,
        )


def _logit_bias(bias: dict[str, float], vocab_size: int) -> dict[int, float]:
    out = {}
    for key, value in bias.items():
        # isdigit alone admits "²" and other digits int() refuses or reads differently.
        if not (key.isascii() and key.isdigit()) or int(key) >= vocab_size:
            raise InvalidRequestError(
                f"logit_bias keys are token ids below {vocab_size}; {key!r} is not",
                param="logit_bias",
            )
        if not -100 <= value <= 100:
            raise InvalidRequestError(
                f"logit_bias values lie in [-100, 100]; token {key} has {value}",
                param="logit_bias",
            )
        out[int(key)] = value
    return out


def _greedy(temperature: float | None) -> bool:
    """Whether vLLM samples greedily at ``temperature`` (unset is vLLM's default, 1.0)."""
    if temperature is None:
        return False
    if 0 < temperature < _VLLM_MAX_TEMP:
        temperature = _VLLM_MAX_TEMP
    return temperature < _VLLM_SAMPLING_EPS


def _check_engine_rules(request: ChatCompletionRequest | CompletionRequest) -> None:
    """Refuse what vLLM's ``SamplingParams._verify_args`` refuses and the schemas admit.

    The stock Triton backend turns those refusals into a failed request (a 502 here, retried by
    SDKs), so they are 400s naming the field before anything is sent.
    """
    n = request.n if request.n is not None else 1
    if n > 1 and _greedy(request.temperature):
        raise InvalidRequestError(
            f"n={n} asks for {n} different choices, but temperature=0 samples greedily and "
            "gives one; send n=1, or a temperature above 0",
            param="n",
        )
    stops = [request.stop] if isinstance(request.stop, str) else request.stop or []
    for i, stop in enumerate(stops):
        if not stop:
            where = "stop" if isinstance(request.stop, str) else f"stop[{i}]"
            raise InvalidRequestError(
                f"{where} is an empty string, which the engine refuses; "
                "leave it out or send a non-empty stop string",
                param="stop",
            )
    for i, word in enumerate(request.bad_words or ()):
        if not word:
            raise InvalidRequestError(
                f"bad_words[{i}] is an empty string, which the engine refuses; leave it out",
                param="bad_words",
            )


_STRUCTURED = (
    "structured outputs (structured_outputs, response_format json_object or json_schema, or a "
    "tool_choice that forces a call)"
)
#: Why each field breaks a grammar's output: vLLM applies its mask beside the grammar's, and a
#: step where they leave no token in common samples one neither allows.
_AGAINST_GRAMMAR = {
    "min_tokens": "once the output is complete the grammar allows only end of sequence, which "
    "min_tokens forbids; set min_tokens to 0",
    "ignore_eos": "once the output is complete the grammar allows only end of sequence, which "
    "ignore_eos would repeat until max_tokens; remove ignore_eos",
    "allowed_token_ids": "a step where the grammar needs a token outside them has none; remove "
    "allowed_token_ids",
    "bad_words": "a step where every token the grammar allows is a bad word has none; remove "
    "bad_words",
}


def _check_beside_grammar(request: ChatCompletionRequest | CompletionRequest) -> None:
    """Refuse the fields that would make a grammar's output invalid, which vLLM accepts."""
    for field, reason in _AGAINST_GRAMMAR.items():
        if getattr(request, field):
            raise InvalidRequestError(
                f"{field} cannot be combined with {_STRUCTURED}: {reason}", param=field
            )


def build_sampling(
    request: ChatCompletionRequest | CompletionRequest,
    *,
    max_tokens: int,
    logprobs: int | None,
    structured: tuple[str, str] | None,
    vocab_size: int,
) -> dict[str, Any]:
    """Map every honoured sampling field; keys the client did not send are left to vLLM."""
    _check_engine_rules(request)
    if request.min_tokens is not None and request.min_tokens > max_tokens:
        raise InvalidRequestError(
            f"min_tokens={request.min_tokens} is more than the {max_tokens} tokens this request "
            "may generate; send at most that",
            param="min_tokens",
        )
    params: dict[str, Any] = {"max_tokens": max_tokens}
    for name in (
        "n",
        "seed",
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "stream_interval",
        "top_k",
        "min_p",
        "repetition_penalty",
        "min_tokens",
        "ignore_eos",
        "include_stop_str_in_output",
        "bad_words",
        "skip_special_tokens",
        "spaces_between_special_tokens",
    ):
        value = getattr(request, name)
        if value is not None:
            params[name] = value
    for name in ("stop_token_ids", "allowed_token_ids"):
        if (ids := getattr(request, name)) is not None:
            check_token_ids(vocab_size, ids, name, name)
            params[name] = ids
    if request.stop is not None:
        params["stop"] = [request.stop] if isinstance(request.stop, str) else request.stop
    if request.logit_bias:
        params["logit_bias"] = _logit_bias(request.logit_bias, vocab_size)
    if request.prompt_logprobs is not None:
        if request.stream:
            raise InvalidRequestError(
                "prompt_logprobs come with the whole response, as in vLLM, and not with a "
                "stream; send stream false, or leave prompt_logprobs out",
                param="prompt_logprobs",
            )
        params["prompt_logprobs"] = request.prompt_logprobs
    if logprobs is not None:
        params["logprobs"] = logprobs
    elif request.return_tokens_as_token_ids:
        raise InvalidRequestError(
            "return_tokens_as_token_ids names the tokens of logprobs, which this request does "
            "not ask for; send logprobs too, or leave it out",
            param="return_tokens_as_token_ids",
        )
    if request.return_token_ids:
        # Triton's backend returns no token ids, but each logprobs entry is keyed by one.
        params.setdefault("logprobs", 0)
    if structured is not None:
        _check_beside_grammar(request)
        key, value = structured
        params[key] = value
    if request.constraints is not None:
        if structured is not None:
            # The engine's constraint processor refuses the pair (a step where the grammar and
            # the constraint share no token would end the request): a 400 here, not a 502.
            raise InvalidRequestError(
                f"constraints cannot be combined with {_STRUCTURED}: send one of them",
                param="constraints",
                code="invalid_constraints",
            )
        try:
            check_sampling_combination(
                min_tokens=request.min_tokens or 0,
                allowed_token_ids=request.allowed_token_ids,
                bad_words=request.bad_words,
                ignore_eos=bool(request.ignore_eos),
                structured_outputs=False,
            )
            spec = parse_constraints(request.constraints)
            # Beside Triton in the pod, the catalogs are here too: an unknown catalog or item id
            # is a 400 now, not an error from inside the engine.
            if (catalog_dir := catalog_dir_from_env()) is not None:
                check_catalog_fields(spec, catalog_dir)
        except ConstraintConfigError as exc:
            raise InvalidRequestError(
                str(exc), param=exc.field, code="invalid_constraints"
            ) from None
        # The client's own mapping, which the engine parses with the same schema: dumping the
        # parsed spec rebuilt every row of a token machine (a 4 MiB body's worth) on the event
        # loop, stalling every other stream for a fraction of a second.
        params["extra_args"] = {"constraints": request.constraints}
    return params
