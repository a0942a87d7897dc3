"""``Engine.step`` against advance + fill: placeholders, shortened lists, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.constraints import _engine
from runtime.constraints.engine import ConstraintEngine, EngineConfigError, EngineStateError

VOCAB = 40
EOS = 0
#: 0 -a-> 1 -b-> 2 (accepting) -a-> 1
A, B = 5, 6


def _machine() -> _engine.Constraint:
    transitions = np.asarray([[0, A, 1], [1, B, 2], [2, A, 1]], dtype=np.int32)
    return _engine.Constraint.token_machine(3, 0, [2], transitions, EOS, [], VOCAB)


def _engine_with(slots: list[int]) -> ConstraintEngine:
    engine = ConstraintEngine(4, VOCAB, 2)
    for slot in slots:
        engine.add(slot, _machine())
    return engine


def _expected(tokens: list[int]) -> np.ndarray:
    engine = _engine_with([0])
    engine.advance(0, tokens)
    row = np.zeros((1, engine.words), dtype=np.int32)
    engine.fill(row, np.asarray([0], dtype=np.int32))
    return row[0]


@pytest.mark.parametrize("wait", [True, False])
def test_step_reads_new_tokens_and_stops_at_a_placeholder(wait: bool) -> None:
    engine = _engine_with([1, 3])
    outputs: list[list[int] | None] = [None, [A, B], None, [A, -1]]
    consumed = np.zeros(4, dtype=np.int64)
    order = np.zeros(4, dtype=np.int32)
    bitmask = np.zeros((4, engine.words), dtype=np.int32)
    rows = np.asarray([1, 3], dtype=np.int32)
    ready = engine.step(outputs, rows, consumed, order, bitmask, wait=wait)
    engine.wait()
    assert (ready, order[:2].tolist(), consumed.tolist()) == (1, [1, 3], [0, 2, 0, 1])
    np.testing.assert_array_equal(bitmask[1], _expected([A, B]))
    assert not bitmask[3].any()  # waiting on its placeholder: not filled
    outputs[3] = [A, B]  # the placeholder's real token
    assert engine.step(outputs, rows[1:], consumed, order, bitmask, fill_waiting=True) == 1
    np.testing.assert_array_equal(bitmask[3], _expected([A, B]))


def test_a_shortened_list_resets_and_replays() -> None:
    engine = _engine_with([0])
    outputs: list[list[int] | None] = [[A, B, A]]
    consumed = np.zeros(1, dtype=np.int64)
    order = np.zeros(1, dtype=np.int32)
    bitmask = np.zeros((4, engine.words), dtype=np.int32)
    rows = np.asarray([0], dtype=np.int32)
    engine.step(outputs, rows, consumed, order, bitmask)
    outputs[0] = [A, B]  # the last token was discarded
    engine.step(outputs, rows, consumed, order, bitmask)
    assert consumed.tolist() == [2]
    np.testing.assert_array_equal(bitmask[0], _expected([A, B]))


def test_step_refuses_bad_rows_before_running() -> None:
    engine = _engine_with([0])
    outputs: list[list[int] | None] = [[A], [A], None, None]
    consumed = np.zeros(4, dtype=np.int64)
    order = np.zeros(4, dtype=np.int32)
    bitmask = np.zeros((4, engine.words), dtype=np.int32)
    with pytest.raises(EngineStateError, match="slot 1 holds no constraint"):
        engine.step(outputs, np.asarray([0, 1], np.int32), consumed, order, bitmask)
    with pytest.raises(EngineConfigError, match="slot 0 is listed twice"):
        engine.step(outputs, np.asarray([0, 0], np.int32), consumed, order, bitmask)
    with pytest.raises(EngineConfigError, match=r"outputs\[2\] must be a list"):
        engine.step(outputs, np.asarray([2], np.int32), consumed, order, bitmask)
