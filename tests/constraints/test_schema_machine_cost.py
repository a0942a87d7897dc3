"""A token machine is checked and compiled in bulk: no Python runs per transition, so one at the
schema's limit (a million rows) holds vLLM's engine loop for tens of milliseconds, not seconds,
and the native pass refuses exactly what pydantic's row-by-row validation refuses."""

from __future__ import annotations

import random
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
from vllm import SamplingParams

import runtime.constraints
from runtime.constraints import schema
from runtime.constraints.batch import ConstraintBatch
from runtime.constraints.catalog import tokenizer_encoder
from runtime.constraints.processor import ConstraintLogitsProcessor
from runtime.constraints.registry import CatalogRegistry
from runtime.constraints.schema import (
    MAX_MACHINE_STATES,
    MAX_MACHINE_TRANSITIONS,
    ConstraintConfigError,
    parse_constraints,
)
from tests.constraints.toy import word_tokenizer

PACKAGE = str(Path(runtime.constraints.__file__).parent)
VOCAB = 128_256


def _machine(states: int, per_state: int) -> dict[str, Any]:
    rows = [
        [s, 1 + (k * 7919 + s) % (VOCAB - 1), (s + 1) % states]
        for s in range(states)
        for k in range(per_state)
    ]
    return {
        "version": 1,
        "token_machine": {"num_states": states, "accepting_states": [0], "transitions": rows},
    }


def _batch(tmp_path: Path) -> ConstraintBatch:
    encode = tokenizer_encoder(word_tokenizer(["a"]))
    return ConstraintBatch(
        max_batch=2,
        vocab_size=VOCAB,
        registry=CatalogRegistry(tmp_path, encode, VOCAB),
        default_eos_token_id=0,
        num_threads=1,
    )


def _package_lines(config: dict[str, Any], batch: ConstraintBatch) -> Counter[str]:
    """Lines of runtime.constraints run to validate ``config`` and add it to ``batch``."""
    lines: Counter[str] = Counter()

    def local(frame: FrameType, event: str, _arg: object) -> Any:
        if event == "line":
            lines[f"{frame.f_code.co_filename}:{frame.f_lineno}"] += 1
        return local

    def calls(frame: FrameType, _event: str, _arg: object) -> Any:
        return local if frame.f_code.co_filename.startswith(PACKAGE) else None

    params = SamplingParams(extra_args={"constraints": config})
    sys.settrace(calls)
    try:
        ConstraintLogitsProcessor.validate_params(params)
        batch.add(0, config, [], 0)
    finally:
        sys.settrace(None)
    assert batch.rejected_requests == 0
    return lines


def test_no_python_runs_per_transition(tmp_path: Path) -> None:
    small = _package_lines(_machine(100, 10), _batch(tmp_path))
    large = _package_lines(_machine(400, 10), _batch(tmp_path))
    grown = {line: (small[line], n) for line, n in large.items() if n > small[line]}
    assert grown == {}


def test_a_machine_at_the_schema_limit_compiles_and_runs(tmp_path: Path) -> None:
    config = _machine(MAX_MACHINE_STATES, MAX_MACHINE_TRANSITIONS // MAX_MACHINE_STATES)
    batch = _batch(tmp_path)
    output: list[int] = []
    batch.add(0, config, output, 0)
    assert batch.rejected_requests == 0
    rows = config["token_machine"]["transitions"]
    for state in (0, 1):
        batch.start_fill()
        batch.finish_fill()
        bits = np.unpackbits(batch.bitmask[0].numpy().view(np.uint8), bitorder="little")
        tokens = sorted(t for s, t, _ in rows if s == state)
        # State 0 accepts, so end of sequence (token 0) is allowed there too.
        assert np.flatnonzero(bits).tolist() == ([0] if state == 0 else []) + tokens
        output.append(tokens[0])


def _random_rows(rng: random.Random) -> object:
    values: list[object] = [0, 1, 2, 3, 5, -1, 2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1]
    values += [True, False, 1.0, "1", None, [], 10**30]

    def number() -> object:
        return rng.randrange(4) if rng.random() < 0.9 else rng.choice(values)

    def row() -> object:
        if rng.random() < 0.03:
            return rng.choice(["abc", 3, None, {"a": 1, "b": 2, "c": 3}])
        size = 3 if rng.random() < 0.9 else rng.choice([0, 2, 4])
        numbers = [number() for _ in range(size)]
        return tuple(numbers) if rng.random() < 0.1 else numbers

    if rng.random() < 0.02:
        return rng.choice(["x", None, 3, ((0, 1, 0),), {"0": 1}])
    return [row() for _ in range(rng.randrange(8))]


def _outcome(config: dict[str, Any]) -> tuple[str, ...]:
    try:
        spec = parse_constraints(config)
    except ConstraintConfigError as exc:
        return ("refused", exc.field, str(exc))
    assert spec.token_machine is not None
    array = spec.token_machine.transitions
    assert array.dtype == np.int64 and array.shape[1:] == (3,) and not array.flags.writeable
    return ("accepted", repr(array.tolist()))


def test_the_native_pass_agrees_with_row_by_row_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(7)
    configs = [
        {
            "version": 1,
            "token_machine": {
                "num_states": rng.choice([1, 3]),
                "accepting_states": [0],
                "transitions": _random_rows(rng),
            },
        }
        for _ in range(1500)
    ]
    native = [_outcome(config) for config in configs]
    monkeypatch.setattr(schema._engine, "transition_rows", lambda rows: None)
    row_by_row = [_outcome(config) for config in configs]
    assert native == row_by_row
    assert {outcome[0] for outcome in native} == {"accepted", "refused"}


@pytest.mark.parametrize(
    ("row", "field", "fragment"),
    [
        ([0, True, 0], "constraints.token_machine.transitions[1][1]", "valid integer"),
        ([0, 1.0, 0], "constraints.token_machine.transitions[1][1]", "valid integer"),
        ([0, 1, 0, 0], "constraints.token_machine.transitions[1]", "at most 3 items"),
        ("abc", "constraints.token_machine.transitions[1]", "valid tuple"),
        ([0, 2**64, 0], "constraints.token_machine.transitions[1]", "fit in 64 bits"),
        ([0, 1, 0], "constraints.token_machine.transitions[1]", "must be deterministic"),
    ],
)
def test_a_bad_row_among_good_ones_is_named(row: object, field: str, fragment: str) -> None:
    config = {
        "version": 1,
        "token_machine": {
            "num_states": 1,
            "accepting_states": [0],
            "transitions": [[0, 1, 0], row, [0, 2, 0]],
        },
    }
    with pytest.raises(ConstraintConfigError) as err:
        parse_constraints(config)
    assert err.value.field == field
    assert fragment in str(err.value)


def test_too_many_transitions_are_refused_naming_the_limit() -> None:
    config = _machine(1, 1)
    config["token_machine"]["transitions"] *= MAX_MACHINE_TRANSITIONS + 1
    with pytest.raises(ConstraintConfigError) as err:
        parse_constraints(config)
    assert err.value.field == "constraints.token_machine.transitions"
    assert "at most 1000000 items" in str(err.value)
