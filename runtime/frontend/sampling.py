"""The backend's ``sampling_parameters`` from the fields shared by chat and text completions."""

from __future__ import annotations

from typing import Any

from runtime.constraints.catalog import catalog_dir_from_env
from runtime.constraints.plan import check_catalog_fields
from runtime.constraints.schema import ConstraintConfigError, parse_constraints
from runtime.frontend.errors import InvalidRequestError
from runtime.frontend.schemas import ChatCompletionRequest, CompletionRequest

__all__ = ["build_sampling", "resolve_max_tokens"]


def resolve_max_tokens(
    requested: int | None, prompt_tokens: int, max_model_len: int, field: str, *, prompt_field: str
) -> int:
    """The explicit budget (``field``), or what is left of the context; never silently shortened.

    A prompt that fills the context is blamed on ``prompt_field``, the route's own input.
    """
    room = max_model_len - prompt_tokens
    if requested is None:
        if room < 1:
            raise InvalidRequestError(
                f"the prompt is {prompt_tokens} tokens; the model's context is {max_model_len}",
                param=prompt_field,
                code="context_length_exceeded",
            )
        return room
    if requested > room:
        raise InvalidRequestError(
            f"{field}={requested} plus the {prompt_tokens}-token prompt exceeds the model's "
            f"context of {max_model_len} tokens; send at most {max(room, 0)}",
            param=field,
            code="context_length_exceeded",
        )
    return requested


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


def build_sampling(
    request: ChatCompletionRequest | CompletionRequest,
    *,
    max_tokens: int,
    logprobs: int | None,
    structured: tuple[str, str] | None,
    vocab_size: int,
) -> dict[str, Any]:
    """Map every honoured sampling field; keys the client did not send are left to vLLM."""
    params: dict[str, Any] = {"max_tokens": max_tokens}
    for name in (
        "n",
        "seed",
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "stream_interval",
    ):
        value = getattr(request, name)
        if value is not None:
            params[name] = value
    if request.stop is not None:
        params["stop"] = [request.stop] if isinstance(request.stop, str) else request.stop
    if request.logit_bias:
        params["logit_bias"] = _logit_bias(request.logit_bias, vocab_size)
    if logprobs is not None:
        params["logprobs"] = logprobs
    if structured is not None:
        key, value = structured
        params[key] = value
    if request.constraints is not None:
        try:
            spec = parse_constraints(request.constraints)
            # Beside Triton in the pod, the catalogs are here too: an unknown catalog or item id
            # is a 400 now, not an error from inside the engine.
            if (catalog_dir := catalog_dir_from_env()) is not None:
                check_catalog_fields(spec, catalog_dir)
        except ConstraintConfigError as exc:
            raise InvalidRequestError(
                str(exc), param=exc.field, code="invalid_constraints"
            ) from None
        params["extra_args"] = {"constraints": spec.model_dump(mode="json", exclude_none=True)}
    return params
