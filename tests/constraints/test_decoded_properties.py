"""Decoded matching in the engine: vLLM's BatchUpdateBuilder drives the V1 processor through
random batch histories over a byte-level vocabulary; at every step each row equals the
reference's, and finished outputs decode to valid item lists. Also the straddling token, and
the engine's own bounds checks for the new entry points."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from runtime.constraints import _engine
from runtime.constraints.engine import (
    ConstraintEngine,
    compile_byte_catalog,
    compile_catalog,
    compile_plan,
    compile_vocabulary,
)
from runtime.constraints.schema import ConstraintConfigError
from tests.constraints.decoded_support import EOS, item_lists, plan_for, tokenize, toy
from tests.constraints.reference import ReferenceConstraint, words_per_row
from tests.constraints.test_processor_properties import _run_history
from tests.constraints.test_runner_v2_properties import _run as _run_v2
from tests.constraints.toy import open_list_rules


def _engine_row(plan: Any, tokens: list[int]) -> np.ndarray:
    _, table = toy()
    engine = ConstraintEngine(2, plan.vocab_size, 1)
    constraint = compile_plan(
        plan, compile_byte_catalog(plan.item_list.catalog), compile_vocabulary(table)
    )
    engine.add(1, constraint)
    engine.advance(1, tokens)
    mask = np.zeros((2, engine.words), dtype=np.int32)
    engine.fill(mask, np.asarray([1], dtype=np.int32))
    return mask[1]


def _bit(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token // 32]) >> (token % 32)) & 1)


def test_engine_accepts_a_straddling_token_in_decoded_mode_only() -> None:
    tokenizer, table = toy()
    straddle = tokenizer.token_to_id("b, ")
    items = [("a", "a"), ("b", "b"), ("c", "bé")]
    config = {"version": 1, "item_list": {"catalog": "cat", "separator": ", ", "max_items": 3}}
    decoded = plan_for(config, tokenize(items, tokenizer, "decoded"), tokenizer, table)
    canonical = plan_for(config, tokenize(items, tokenizer, "canonical"), tokenizer, table)
    assert _bit(_engine_row(decoded, []), straddle)
    engine = ConstraintEngine(1, canonical.vocab_size, 1)
    tokenized = canonical.item_list.catalog
    engine.add(0, compile_plan(canonical, compile_catalog(tokenized, canonical.vocab_size)))
    mask = np.zeros((1, engine.words), dtype=np.int32)
    engine.fill(mask, np.asarray([0], dtype=np.int32))
    assert not _bit(mask[0], straddle)
    # After the straddling token the engine agrees with the reference: the next item starts.
    after = _engine_row(decoded, [straddle])
    ref = ReferenceConstraint(decoded)
    ref.advance(straddle)
    expected = np.zeros(words_per_row(decoded.vocab_size), dtype=np.int32)
    ref.fill_row(expected)
    np.testing.assert_array_equal(after, expected)
    assert _bit(after, tokenizer.token_to_id("a")) and not _bit(after, EOS)


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(case=item_lists(), walk=st.lists(st.integers(0, 10**6), max_size=12))
def test_engine_row_equals_reference_after_any_walk(
    case: tuple[list[tuple[str, str]], dict[str, Any]], walk: list[int]
) -> None:
    """Along a walk that picks allowed tokens (and sometimes a refused one), rows agree."""
    tokenizer, table = toy()
    items, config = case
    try:
        plan = plan_for(config, tokenize(items, tokenizer, "decoded"), tokenizer, table)
    except ConstraintConfigError:
        assume(False)
    ref = ReferenceConstraint(plan)
    engine = ConstraintEngine(1, plan.vocab_size, 1)
    engine.add(
        0,
        compile_plan(plan, compile_byte_catalog(plan.item_list.catalog), compile_vocabulary(table)),
    )
    expected = np.zeros(words_per_row(plan.vocab_size), dtype=np.int32)
    mask = np.zeros((1, engine.words), dtype=np.int32)
    for step, pick in enumerate(walk):
        ref.fill_row(expected)
        engine.fill(mask, np.asarray([0], dtype=np.int32))
        np.testing.assert_array_equal(mask[0], expected, err_msg=f"step {step}")
        assert engine.slot_info(0)["dead_ends"] == ref.dead_ends
        allowed = np.flatnonzero(np.unpackbits(expected.view(np.uint8), bitorder="little"))
        token = int(allowed[pick % len(allowed)]) if pick % 7 else pick % plan.vocab_size
        ref.advance(token)
        engine.advance(0, [token])
        assert engine.slot_info(0)["finished"] == ref.finished
        assert engine.slot_info(0)["rejected_tokens"] == ref.rejected_tokens


History = tuple[list[tuple[str, str]], list[dict[str, Any]], int]
"""A catalog's items, the constraint configurations of one batch history, the vocabulary size."""


@st.composite
def histories(draw: st.DrawFn) -> History:
    """Histories over one catalog whose configurations its decoded plan accepts (at least one)."""
    items, first = draw(item_lists())
    configs = [first] + [draw(item_lists()) for _ in range(draw(st.integers(0, 7)))]
    # Every request of one history uses the first draw's catalog.
    ids = {i for i, _ in items}
    same = [first]
    for _, config in configs[1:]:
        spec = config["item_list"]
        if set(spec.get("allow") or []) <= ids and set(spec.get("deny", [])) <= ids:
            same.append(config)
    pad = draw(st.sampled_from([0, 3, 40]))
    valid = _valid_configs(items, same)
    assume(valid)
    return items, valid, len(toy()[1]) + pad


def _valid_configs(items: list[tuple[str, str]], configs: list[dict[str, Any]]) -> list[dict]:
    tokenizer, table = toy()
    tokenized = tokenize(items, tokenizer, "decoded")
    valid = []
    for config in configs:
        try:
            plan_for(config, tokenized, tokenizer, table)
        except ConstraintConfigError:
            continue
        valid.append(config)
    return valid


# Histories tokenize a catalog and plan every configuration: slow, large draws are expected.
_HEAVY_EXAMPLES = [HealthCheck.too_slow, HealthCheck.data_too_large]


@settings(max_examples=25, suppress_health_check=_HEAVY_EXAMPLES)
@given(case=histories(), seed=st.integers(0, 2**32 - 1))
def test_engine_matches_reference_over_batch_histories_in_decoded_mode(
    case: History, seed: int
) -> None:
    items, configs, vocab = case
    _run_history(items, configs, seed, vocab, toy()[0], "decoded")


@settings(max_examples=10, suppress_health_check=_HEAVY_EXAMPLES)
@given(case=histories(), seed=st.integers(0, 2**32 - 1))
def test_runner_v2_matches_reference_in_decoded_mode(case: History, seed: int) -> None:
    items, configs, vocab = case
    _run_v2(items, [*configs, None], seed, vocab, toy()[0], "decoded")


def test_vocabulary_and_decoded_constraint_check_their_arguments() -> None:
    with pytest.raises(ValueError, match="bytes must be uint8"):
        _engine.Vocabulary(np.zeros(3, dtype=np.int32), np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError, match="offsets must start at 0"):
        _engine.Vocabulary(np.zeros(3, dtype=np.uint8), np.asarray([0, 2], dtype=np.int64))
    with pytest.raises(ValueError, match="must not decrease"):
        _engine.Vocabulary(np.zeros(3, dtype=np.uint8), np.asarray([0, 3, 1, 3], dtype=np.int64))
    vocab = _engine.Vocabulary(np.frombuffer(b"abab", dtype=np.uint8), np.asarray([0, 0, 1, 2, 4]))
    assert (vocab.vocab_size, vocab.max_token_length) == (4, 2)
    byte_catalog = _engine.Catalog(np.asarray([97, 98], np.int32), np.asarray([0, 1, 2]), 256)
    token_catalog = _engine.Catalog(np.asarray([2, 3], np.int32), np.asarray([0, 1, 2]), 4)

    def build(catalog: Any = byte_catalog, **changes: Any) -> Any:
        args: dict[str, Any] = {
            "catalog": catalog,
            "vocabulary": vocab,
            "prefix": b"",
            "separator": b",",
            "terminator": b"",
            **open_list_rules(),
            "vocab_size": 4,
        }
        return _engine.Constraint.decoded_item_list(**{**args, **changes})

    build()
    for changes, message in [
        ({"catalog": token_catalog}, "compiled over bytes"),
        ({"vocab_size": 5}, "the vocabulary has 4 tokens"),
        ({"separator": b""}, "separator must have at least one byte"),
        ({"terminator": b",]"}, "start with different bytes"),
        ({"allowed": np.asarray([2], np.int32)}, "allowed item index 2"),
        ({"max_items": 0}, "max_items must be >= 1"),
        ({"min_items": 3, "max_items": 2}, "must not exceed max_items"),
        ({"allowed": np.asarray([0], np.int64)}, "allowed must be int32"),
    ]:
        with pytest.raises(ValueError, match=message):
            build(**changes)


@pytest.mark.parametrize("unique", [True, False])
def test_an_item_twice_inside_one_token_counts_for_unique(unique: bool) -> None:
    tokenizer, table = toy()
    twice = tokenizer.token_to_id("a, a, ")
    items = [("a", "a"), ("ab", "ab"), ("c", "c")]
    spec = {"catalog": "cat", "separator": ", ", "unique": unique}
    plan = plan_for(
        {"version": 1, "item_list": spec}, tokenize(items, tokenizer, "decoded"), tokenizer, table
    )
    ref = ReferenceConstraint(plan)
    assert (twice in ref.allowed()[0]) is not unique
    assert _bit(_engine_row(plan, []), twice) is not unique
    # With "a" used, "ab" is still reachable through the bytes "a" spelled again.
    ref.advance(tokenizer.token_to_id("a"))
    ref.advance(tokenizer.token_to_id(","))
    expected = np.zeros(words_per_row(plan.vocab_size), dtype=np.int32)
    ref.fill_row(expected)
    path = [tokenizer.token_to_id("a"), tokenizer.token_to_id(",")]
    np.testing.assert_array_equal(_engine_row(plan, path), expected)
