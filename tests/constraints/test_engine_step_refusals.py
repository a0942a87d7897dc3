"""``Engine.step`` (the binding) refuses a bad ``consumed`` count and, refused at any row, leaves
``consumed``, ``order`` and every slot as they were."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.constraints import _engine

VOCAB = 64
EOS = 0
A, B = 7, 8
#: 0 -A-> 1 -B-> 2 (accepting)
TRANSITIONS = np.asarray([[0, A, 1], [1, B, 2]], dtype=np.int32)


def _new_engine(slots: int = 3) -> _engine.Engine:
    engine = _engine.Engine(slots, VOCAB, 1)
    for slot in range(slots):
        engine.add(slot, _engine.Constraint.token_machine(3, 0, [2], TRANSITIONS, EOS, [], VOCAB))
    return engine


def _allowed(bitmask: np.ndarray, row: int) -> list[int]:
    bits = np.unpackbits(bitmask[row].view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:VOCAB]).tolist()


def _step(
    engine: _engine.Engine,
    outputs: list[list[int] | None],
    rows: list[int],
    consumed: np.ndarray,
    order: np.ndarray,
    bitmask: np.ndarray,
) -> int:
    return int(
        engine.step(outputs, np.asarray(rows, np.int32), consumed, order, bitmask, False, True)
    )


@pytest.mark.parametrize("bad", [-1, -(10**6), np.iinfo(np.int64).min])
def test_a_negative_consumed_count_is_refused_naming_the_row(bad: int) -> None:
    engine = _new_engine()
    outputs: list[list[int] | None] = [[A], [A, B], [A]]
    consumed = np.asarray([0, 0, bad], np.int64)
    order = np.full(3, -5, np.int32)
    bitmask = np.zeros((3, 2), np.int32)
    with pytest.raises(ValueError, match=rf"consumed\[2\] must be >= 0 .* got {bad}$"):
        _step(engine, outputs, [0, 1, 2], consumed, order, bitmask)
    assert consumed.tolist() == [0, 0, bad]
    assert order.tolist() == [-5, -5, -5]
    assert not bitmask.any()
    # No slot moved: the rows' first real step sees every token from the start.
    consumed[2] = 0
    assert _step(engine, outputs, [0, 1, 2], consumed, order, bitmask) == 3
    assert consumed.tolist() == [1, 2, 1]
    assert [_allowed(bitmask, r) for r in range(3)] == [[B], [EOS], [B]]


def test_a_row_past_the_end_of_the_lists_is_refused_unchanged() -> None:
    engine = _new_engine()
    outputs: list[list[int] | None] = [[A], [A, B]]
    consumed = np.zeros(3, np.int64)
    order = np.full(3, -5, np.int32)
    bitmask = np.zeros((3, 2), np.int32)
    with pytest.raises(ValueError, match="row 2 is outside the 2 output lists"):
        _step(engine, outputs, [0, 1, 2], consumed, order, bitmask)
    assert consumed.tolist() == [0, 0, 0] and order.tolist() == [-5, -5, -5]


def test_a_consumed_count_past_the_end_of_its_list_replays_it() -> None:
    """Not an error: a list shorter than its count had tokens discarded, and is replayed."""
    engine = _new_engine()
    outputs: list[list[int] | None] = [[A, B, A], None, None]
    consumed = np.zeros(3, np.int64)
    order = np.zeros(3, np.int32)
    bitmask = np.zeros((3, 2), np.int32)
    _step(engine, outputs, [0], consumed, order, bitmask)
    outputs[0] = [A]
    consumed[0] = np.iinfo(np.int64).max
    _step(engine, outputs, [0], consumed, order, bitmask)
    assert consumed[0] == 1 and _allowed(bitmask, 0) == [B]


@pytest.mark.parametrize(
    ("late_row", "error"),
    [
        ([2**40], ValueError),  # the binding refuses the token
        (["not a token"], TypeError),  # Python refuses the conversion
    ],
)
def test_a_row_refused_after_others_commits_nothing(late_row: list[object], error: type) -> None:
    engine = _new_engine()
    outputs: list[object] = [[A], [A, B], late_row]
    consumed = np.zeros(3, np.int64)
    order = np.full(3, -5, np.int32)
    bitmask = np.zeros((3, 2), np.int32)
    with pytest.raises(error):
        _step(engine, outputs, [0, 1, 2], consumed, order, bitmask)  # type: ignore[arg-type]
    assert consumed.tolist() == [0, 0, 0]
    assert order.tolist() == [-5, -5, -5]
    outputs[2] = [A]
    assert _step(engine, outputs, [0, 1, 2], consumed, order, bitmask) == 3  # type: ignore[arg-type]
    # Rows 0 and 1 advanced exactly once by the tokens they had before the refused call.
    assert consumed.tolist() == [1, 2, 1]
    assert [_allowed(bitmask, r) for r in range(3)] == [[B], [EOS], [B]]


@pytest.mark.parametrize("wait", [True, False])
def test_a_step_the_engine_refuses_commits_nothing(wait: bool) -> None:
    engine = _new_engine(3)
    engine.remove(2)
    outputs: list[list[int] | None] = [[A], [A, B], [A]]
    consumed = np.zeros(3, np.int64)
    order = np.full(3, -5, np.int32)
    bitmask = np.zeros((3, 2), np.int32)
    rows = np.asarray([0, 1, 2], np.int32)
    with pytest.raises(RuntimeError, match="slot 2 holds no constraint"):
        engine.step(outputs, rows, consumed, order, bitmask, False, wait)
    with pytest.raises(ValueError, match="slot 0 is listed twice"):
        engine.step(outputs, np.asarray([0, 0], np.int32), consumed, order, bitmask, False, wait)
    assert consumed.tolist() == [0, 0, 0] and order.tolist() == [-5, -5, -5]
    assert engine.step(outputs, rows[:2], consumed, order, bitmask, False, wait) == 2
    engine.wait()
    assert consumed.tolist() == [1, 2, 0] and order[:2].tolist() == [0, 1]
    assert [_allowed(bitmask, r) for r in range(2)] == [[B], [EOS]]
