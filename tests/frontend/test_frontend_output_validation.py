"""Which invalid output the client's stop sequences are blamed for: output that stopped
unfinished (a 400 ``output_stopped``), never complete output that breaks the format (a 502)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from runtime.frontend.errors import (
    IncompleteOutputError,
    InvalidOutputError,
    TruncatedOutputError,
)
from runtime.frontend.generation import counted_invalid_output
from runtime.frontend.state import FrontendMetrics
from runtime.frontend.structured import ChoiceRequirement, JsonRequirement
from runtime.frontend.tool_parsers import NamedToolStream

SCHEMA = {"type": "object", "properties": {"a": {"enum": ["x"]}}, "required": ["a"]}
STRICT = {"lookup": {**SCHEMA, "additionalProperties": False}}


def _json(text: str) -> None:
    JsonRequirement(SCHEMA).validate(text, index=0, finish_reason="stop")


def _choice(text: str) -> None:
    ChoiceRequirement(("alpha beta", "gamma")).validate(text, index=0, finish_reason="stop")


def _forced_call(text: str) -> None:
    parser = NamedToolStream("lookup", STRICT)
    parser.feed(text)
    parser.finish("stop")


UNFINISHED = [(_json, '{"a": "'), (_choice, "alpha "), (_forced_call, '{"a": ')]
WRONG = [(_json, '{"a": "y"}'), (_choice, "delta"), (_forced_call, '{"a": "y"}')]


def _checked(check: Callable[[str], None], text: str, stop: str | None) -> None:
    metrics = FrontendMetrics()
    state: Any = SimpleNamespace(metrics=metrics, settings=SimpleNamespace(model_id="m"))
    try:
        with counted_invalid_output(state, "/r", 0, "stop", stop):
            check(text)
    finally:
        assert (
            metrics.registry.get_sample_value(
                "llm_serving_frontend_invalid_output_total", {"model": "m", "route": "/r"}
            )
            == 1
        )


@pytest.mark.parametrize(("check", "text"), UNFINISHED)
def test_unfinished_output_with_stop_sequences_is_the_clients_400(
    check: Callable[[str], None], text: str
) -> None:
    with pytest.raises(TruncatedOutputError) as raised:
        _checked(check, text, "stop_token_ids")
    assert raised.value.code == "output_stopped" and raised.value.param == "stop_token_ids"
    # Without stop sequences only the engine can have ended it early: a 502.
    with pytest.raises(IncompleteOutputError):
        _checked(check, text, None)


@pytest.mark.parametrize(("check", "text"), WRONG)
def test_complete_output_that_breaks_the_format_stays_a_502(
    check: Callable[[str], None], text: str
) -> None:
    with pytest.raises(InvalidOutputError) as raised:
        _checked(check, text, "stop")
    assert not isinstance(raised.value, IncompleteOutputError | TruncatedOutputError)
