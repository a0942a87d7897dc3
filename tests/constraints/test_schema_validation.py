"""The constraint language's structural validation: every bad field is named in the error."""

from __future__ import annotations

import json

import pytest

from runtime.constraints.schema import (
    ConstraintConfigError,
    ConstraintSpec,
    constraints_json_schema,
    parse_constraints,
)

MACHINE = {"num_states": 2, "accepting_states": [1], "transitions": [[0, 5, 1], [1, 6, 1]]}


def test_item_list_defaults() -> None:
    spec = parse_constraints({"version": 1, "item_list": {"catalog": "films"}})
    assert isinstance(spec, ConstraintSpec)
    item_list = spec.item_list
    assert item_list is not None
    assert (item_list.prefix, item_list.separator, item_list.terminator) == ("", ", ", "")
    assert (item_list.min_items, item_list.max_items, item_list.unique) == (1, None, False)
    assert item_list.allow is None and item_list.deny == []


def test_json_text_and_machine_with_banned_tokens() -> None:
    text = json.dumps({"version": 1, "token_machine": MACHINE, "banned_tokens": [3, 4]})
    spec = parse_constraints(text)
    assert spec.token_machine is not None
    assert spec.token_machine.transitions.tolist() == [[0, 5, 1], [1, 6, 1]]
    assert spec.banned_tokens == [3, 4]


def test_banned_tokens_alone() -> None:
    assert parse_constraints({"version": 1, "banned_tokens": [0]}).banned_tokens == [0]


@pytest.mark.parametrize(
    ("value", "field", "fragment"),
    [
        ([1], "constraints", "expected a JSON object, got list"),
        ("{not json", "constraints", "not valid JSON"),
        ({"item_list": {"catalog": "c"}}, "constraints.version", "the only version is 1"),
        ({"version": 2, "banned_tokens": [1]}, "constraints.version", "Input should be 1"),
        ({"version": True, "banned_tokens": [1]}, "constraints.version", "got bool"),
        ({"version": 1.0, "banned_tokens": [1]}, "constraints.version", "got float"),
        (
            '{"version": 1, "banned_tokens": ' + "[" * 50_000 + "]" * 50_000 + "}",
            "constraints",
            "not valid JSON: nested too deeply",
        ),
        ({"version": 1}, "constraints", "at least one of item_list, token_machine"),
        ({"version": 1, "extra": 1}, "constraints.extra", "unknown field"),
        (
            {"version": 1, "item_list": {"catalog": "c"}, "token_machine": MACHINE},
            "constraints.token_machine",
            "either item_list or token_machine",
        ),
        ({"version": 1, "item_list": {}}, "constraints.item_list.catalog", "Field required"),
        ({"version": 1, "item_list": {"catalog": ""}}, "constraints.item_list.catalog", "least 1"),
        (
            {"version": 1, "item_list": {"catalog": "c", "min_items": 4, "max_items": 2}},
            "constraints.item_list.max_items",
            "min_items (4) must not exceed max_items (2)",
        ),
        (
            {"version": 1, "item_list": {"catalog": "c", "min_items": 0}},
            "constraints.item_list.min_items",
            "greater than or equal to 1",
        ),
        (
            {"version": 1, "item_list": {"catalog": "c", "max_items": "3"}},
            "constraints.item_list.max_items",
            "valid integer",
        ),
        (
            {"version": 1, "item_list": {"catalog": "c", "allow": []}},
            "constraints.item_list.allow",
            "at least 1 item",
        ),
        (
            {"version": 1, "item_list": {"catalog": "c", "allow": ["a", 7]}},
            "constraints.item_list.allow[1]",
            "valid string",
        ),
        (
            {"version": 1, "item_list": {"catalog": "c", "separator": ""}},
            "constraints.item_list.separator",
            "at least 1 character",
        ),
        (
            {"version": 1, "item_list": {"catalog": "c", "unique": "yes"}},
            "constraints.item_list.unique",
            "valid boolean",
        ),
        (
            {"version": 1, "token_machine": {**MACHINE, "initial_state": 2}},
            "constraints.token_machine.initial_state",
            "state 2 is not below num_states (2)",
        ),
        (
            {"version": 1, "token_machine": {**MACHINE, "accepting_states": [0, 9]}},
            "constraints.token_machine.accepting_states[1]",
            "state 9 is not in 0..1",
        ),
        (
            {"version": 1, "token_machine": {**MACHINE, "accepting_states": []}},
            "constraints.token_machine.accepting_states",
            "at least 1 item",
        ),
        (
            {"version": 1, "token_machine": {**MACHINE, "transitions": [[0, 5, 1], [0, 5, 0]]}},
            "constraints.token_machine.transitions[1]",
            "must be deterministic",
        ),
        (
            {"version": 1, "token_machine": {**MACHINE, "transitions": [[0, 5, 4]]}},
            "constraints.token_machine.transitions[0]",
            "states must be in 0..1",
        ),
        (
            {"version": 1, "token_machine": {**MACHINE, "transitions": [[0, -5, 1]]}},
            "constraints.token_machine.transitions[0]",
            "token id must be >= 0",
        ),
        (
            {"version": 1, "token_machine": {**MACHINE, "transitions": [[0, 5]]}},
            "constraints.token_machine.transitions[0][2]",
            "Field required",
        ),
        (
            {"version": 1, "token_machine": {**MACHINE, "num_states": 0}},
            "constraints.token_machine.num_states",
            "greater than or equal to 1",
        ),
        (
            {"version": 1, "banned_tokens": [1, -3]},
            "constraints.banned_tokens[1]",
            "token id must be >= 0, got -3",
        ),
    ],
)
def test_bad_configuration_names_the_field(value: object, field: str, fragment: str) -> None:
    with pytest.raises(ConstraintConfigError) as info:
        parse_constraints(value)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_json_schema_describes_the_language() -> None:
    schema = constraints_json_schema()
    assert schema["title"] == "ConstraintSpec"
    assert set(schema["properties"]) == {"version", "item_list", "token_machine", "banned_tokens"}
    assert "ItemListSpec" in schema["$defs"] and "TokenMachineSpec" in schema["$defs"]
