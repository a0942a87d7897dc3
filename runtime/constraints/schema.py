"""The per-request constraint language (version 1): pydantic models and one parse function.

A request sends ``{"version": 1, ...}`` with an ``item_list`` over a named catalog or a
``token_machine`` (not both), optionally intersected with ``banned_tokens``. Only structural
rules live here; checks that need the catalog or the tokenizer happen when the processor
validates the request, and raise the same :class:`ConstraintConfigError`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetPydanticSchema,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import core_schema

from runtime.constraints import _engine

__all__ = [
    "MAX_ALLOW_ITEMS",
    "MAX_LIST_ITEMS",
    "ConstraintConfigError",
    "ConstraintSpec",
    "ItemListSpec",
    "TokenMachineSpec",
    "check_sampling_combination",
    "constraints_json_schema",
    "parse_constraints",
]

#: Largest per-request ``allow`` list the engine accepts.
MAX_ALLOW_ITEMS = 100_000
#: Largest ``min_items`` / ``max_items``: the engine counts a list's items in 32 bits.
MAX_LIST_ITEMS = 2**32 - 1
#: Largest token state machine a request may send.
MAX_MACHINE_STATES = 100_000
MAX_MACHINE_TRANSITIONS = 1_000_000
_ROOT = "constraints"


class ConstraintConfigError(ValueError):
    """A constraint configuration is invalid; ``field`` is the dotted path of the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ItemListSpec(_Strict):
    """``prefix item (separator item)* terminator``, then end of sequence, over a catalog."""

    catalog: str = Field(min_length=1, description="Name of a catalog shipped with the model.")
    prefix: str = Field(default="", description="Text before the first item.")
    separator: str = Field(default=", ", min_length=1, description="Text between two items.")
    terminator: str = Field(
        default="", description="Text after the last item; empty means end of sequence."
    )
    min_items: int = Field(
        default=1, ge=1, le=MAX_LIST_ITEMS, description="Fewest items in the list."
    )
    max_items: int | None = Field(
        default=None, ge=1, le=MAX_LIST_ITEMS, description="Most items; none = no limit."
    )
    unique: bool = Field(default=False, description="No item may appear twice.")
    allow: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ALLOW_ITEMS,
        description="Only these catalog item ids may appear (1 to 100,000 ids).",
    )
    deny: list[str] = Field(default_factory=list, description="These item ids never appear.")

    @model_validator(mode="after")
    def _check_bounds(self) -> ItemListSpec:
        if self.max_items is not None and self.min_items > self.max_items:
            raise _FieldError(
                ("max_items",),
                f"min_items ({self.min_items}) must not exceed max_items ({self.max_items})",
            )
        return self


#: ``[state, token_id, next_state]`` rows as JSON sends them (what the JSON Schema states).
_TransitionRows = Annotated[list[tuple[int, int, int]], Field(max_length=MAX_MACHINE_TRANSITIONS)]


def _transition_array(value: object, rows: ValidatorFunctionWrapHandler) -> np.ndarray:
    """The rows as a read-only int64 array of shape (n, 3), converted natively in one pass.

    A million rows validated one by one would hold vLLM's engine loop for a second; only input
    the native pass refuses is validated row by row, for pydantic's error naming the row.
    """
    array = None
    if isinstance(value, list) and len(value) <= MAX_MACHINE_TRANSITIONS:
        array = _engine.transition_rows(value)
    if array is None:
        if isinstance(value, list):
            # JSON has no tuples: rows arrive as lists, so strict mode is relaxed for them.
            value = [tuple(row) if isinstance(row, list) else row for row in value]
        checked = rows(value)
        for i, row in enumerate(checked):
            if not all(-(2**63) <= number < 2**63 for number in row):
                raise _FieldError((i,), f"values must fit in 64 bits, got {list(row)}")
        array = np.array(checked, dtype=np.int64).reshape(-1, 3)
    array.flags.writeable = False
    return array


def _transitions_schema(_source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
    return core_schema.no_info_wrap_validator_function(
        _transition_array,
        handler.generate_schema(_TransitionRows),
        serialization=core_schema.plain_serializer_function_ser_schema(np.ndarray.tolist),
    )


#: A token machine's transitions: int64 ``[state, token_id, next_state]`` rows, read-only.
_Transitions = Annotated[np.ndarray, GetPydanticSchema(_transitions_schema)]


def _first_repeat(states: np.ndarray, tokens: np.ndarray) -> int | None:
    """The first row whose (state, token) an earlier row has (states in range, tokens >= 0)."""
    if tokens.size < 2:
        return None
    # States are below 2**17: with tokens below 2**46 one int64 key sorts a row, and a plain
    # sort (several times faster than a stable one) tells whether any row repeats at all.
    if int(tokens.max()) < 2**46:
        keys = (states << 46) | tokens
        ordered = np.sort(keys)
        if not (ordered[1:] == ordered[:-1]).any():
            return None
        order = np.argsort(keys, kind="stable")
    else:
        order = np.lexsort((tokens, states))
    s, t = states[order], tokens[order]
    repeats = order[1:][(s[1:] == s[:-1]) & (t[1:] == t[:-1])]
    return int(repeats.min()) if repeats.size else None


class TokenMachineSpec(_Strict):
    """A deterministic automaton over token ids; end of sequence is allowed in accepting states."""

    num_states: int = Field(ge=1, le=MAX_MACHINE_STATES, description="States are 0..num_states-1.")
    initial_state: int = Field(default=0, ge=0, description="State before the first token.")
    accepting_states: list[int] = Field(
        min_length=1, description="States in which the output may end."
    )
    transitions: _Transitions = Field(
        description="[state, token_id, next_state] triples; at most one per (state, token_id)."
    )

    @model_validator(mode="after")
    def _check_table(self) -> TokenMachineSpec:
        n = self.num_states
        if self.initial_state >= n:
            raise _FieldError(
                ("initial_state",), f"state {self.initial_state} is not below num_states ({n})"
            )
        for i, state in enumerate(self.accepting_states):
            if not 0 <= state < n:
                raise _FieldError(
                    ("accepting_states", i), f"state {state} is not in 0..{n - 1} (num_states={n})"
                )
        states, tokens, targets = self.transitions.T
        bad_states = (states < 0) | (states >= n) | (targets < 0) | (targets >= n)
        bad = bad_states | (tokens < 0)
        first_bad = int(np.argmax(bad)) if bad.any() else len(bad)
        # The rows before the first bad one are all in range; a repeat among them comes first.
        repeat = _first_repeat(states[:first_bad], tokens[:first_bad])
        if repeat is not None:
            state, token = int(states[repeat]), int(tokens[repeat])
            raise _FieldError(
                ("transitions", repeat),
                f"state {state} already has a transition on token {token}; the machine "
                "must be deterministic",
            )
        if first_bad < len(bad):
            state, token, target = (int(v) for v in self.transitions[first_bad])
            if bad_states[first_bad]:
                raise _FieldError(
                    ("transitions", first_bad),
                    f"states must be in 0..{n - 1} (num_states={n}), got [{state}, {token}, "
                    f"{target}]",
                )
            raise _FieldError(("transitions", first_bad), f"token id must be >= 0, got {token}")
        return self


class ConstraintSpec(_Strict):
    """Version 1 of the constraint language: one rule, optionally minus banned tokens."""

    version: Literal[1] = Field(description="Version of the constraint language; must be 1.")
    item_list: ItemListSpec | None = None
    token_machine: TokenMachineSpec | None = None
    banned_tokens: list[int] | None = Field(
        default=None, description="Token ids never allowed, alone or intersected with the rule."
    )

    @field_validator("version", mode="before")
    @classmethod
    def _exact_version(cls, value: object) -> object:
        # Literal[1] compares with ==, so strict mode alone lets true and 1.0 through.
        if type(value) is not int:
            raise _FieldError((), f"Input should be 1 (an integer), got {type(value).__name__}")
        return value

    @model_validator(mode="after")
    def _check_rules(self) -> ConstraintSpec:
        if self.item_list is not None and self.token_machine is not None:
            raise _FieldError(
                ("token_machine",), "give either item_list or token_machine, not both"
            )
        if self.item_list is None and self.token_machine is None and self.banned_tokens is None:
            raise _FieldError((), "give at least one of item_list, token_machine, banned_tokens")
        for i, token in enumerate(self.banned_tokens or ()):
            if token < 0:
                raise _FieldError(("banned_tokens", i), f"token id must be >= 0, got {token}")
        return self


def check_sampling_combination(
    *,
    min_tokens: int,
    allowed_token_ids: Sequence[int] | None,
    bad_words: Sequence[str] | None,
    ignore_eos: bool,
    structured_outputs: bool,
) -> None:
    """Refuse sampling parameters that mask logits beside a constraint, or keep it running.

    vLLM applies each mask on its own, so a step where they leave no token in common is an all
    -inf row: the sampler then picks a token neither allowed (token 0 in practice), appended to
    the output until another limit ends it. Which tokens a constraint needs (separator,
    terminator, end of sequence) is known only with the tokenizer, so the combination is
    refused whatever the values. ``ignore_eos`` would not stop at the end of sequence that a
    complete constraint allows alone. Free of vLLM, so the frontend refuses the same pairs.
    """
    if min_tokens > 0:
        raise ConstraintConfigError(
            "min_tokens",
            f"min_tokens={min_tokens} cannot be combined with constraints: a constraint "
            "allows only end of sequence once its list or machine is complete, which min_tokens "
            "forbids; set min_tokens to 0 (item_list.min_items bounds the list's length)",
        )
    if allowed_token_ids is not None:
        raise ConstraintConfigError(
            "allowed_token_ids",
            "allowed_token_ids cannot be combined with constraints: a step whose constraint "
            "needs a token outside them (a separator, the terminator, end of sequence) would "
            "have none; remove allowed_token_ids and ban tokens with constraints.banned_tokens "
            "or allow them with a token_machine",
        )
    if bad_words:
        raise ConstraintConfigError(
            "bad_words",
            "bad_words cannot be combined with constraints: vLLM removes them beside the "
            "constraint's mask, so a step whose allowed tokens are all bad words has none; "
            "remove bad_words and put their token ids in constraints.banned_tokens, which the "
            "constraint never allows and ends the output when nothing else is left",
        )
    if ignore_eos:
        raise ConstraintConfigError(
            "ignore_eos",
            "ignore_eos cannot be combined with constraints: once its list or machine is "
            "complete a constraint allows only end of sequence, and with ignore_eos the request "
            "would emit it until max_tokens; remove ignore_eos (item_list.min_items bounds the "
            "list's length)",
        )
    if structured_outputs:
        raise ConstraintConfigError(
            "structured_outputs",
            "structured outputs (response_format, JSON, regex, grammar) cannot be combined with "
            "constraints: a step where the grammar and the constraint share no token ends the "
            "request with an error; send one of them",
        )


class _FieldError(ValueError):
    """Raised inside validators to carry a location relative to the model being validated."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


def _dotted(loc: tuple[str | int, ...]) -> str:
    path = _ROOT
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _first_error(exc: ValidationError) -> ConstraintConfigError:
    error = exc.errors(include_url=False)[0]
    loc = tuple(error["loc"])
    # Pydantic names the union branch or wraps model validators; a _FieldError carries its own
    # location relative to the model that raised it.
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, _FieldError):
        return ConstraintConfigError(_dotted(loc + cause.loc), cause.message)
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    return ConstraintConfigError(_dotted(loc), message)


def parse_constraints(value: object) -> ConstraintSpec:
    """Validate a constraint configuration (a mapping or its JSON text) structurally."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConstraintConfigError(_ROOT, f"not valid JSON: {exc}") from None
        except RecursionError:
            # vLLM turns only ValueError into a 400; a RecursionError would be a server error.
            raise ConstraintConfigError(_ROOT, "not valid JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise ConstraintConfigError(_ROOT, f"expected a JSON object, got {type(value).__name__}")
    if "version" not in value:
        raise ConstraintConfigError(f"{_ROOT}.version", "missing; the only version is 1")
    try:
        return ConstraintSpec.model_validate(value)
    except ValidationError as exc:
        raise _first_error(exc) from None


def constraints_json_schema() -> dict[str, Any]:
    """JSON Schema of the constraint language, for OpenAPI and the docs."""
    return ConstraintSpec.model_json_schema()
