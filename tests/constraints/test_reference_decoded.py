"""The reference's decoded mode: straddling tokens, its trie walk against a per-token
simulation, and random outputs that always spell a valid list."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from runtime.constraints.schema import ConstraintConfigError
from tests.constraints.decoded_support import (
    EOS,
    item_lists,
    plan_for,
    spells_valid_list,
    tokenize,
    toy,
)
from tests.constraints.reference import ReferenceConstraint, words_per_row


def _decoded_plan(items: list[tuple[str, str]], config: dict[str, Any]) -> Any:
    tokenizer, table = toy()
    tokenized = tokenize(items, tokenizer, "decoded")
    try:
        return plan_for(config, tokenized, tokenizer, table)
    except ConstraintConfigError:
        assume(False)


def test_a_token_straddling_item_and_separator_is_decoded_only() -> None:
    tokenizer, table = toy()
    straddle = tokenizer.token_to_id("b, ")
    assert table[straddle] == b"b, "
    items = [("a", "a"), ("b", "b"), ("c", "bé")]
    config = {"version": 1, "item_list": {"catalog": "cat", "separator": ", ", "max_items": 3}}
    decoded = ReferenceConstraint(
        plan_for(config, tokenize(items, tokenizer, "decoded"), tokenizer, table)
    )
    canonical = ReferenceConstraint(
        plan_for(config, tokenize(items, tokenizer, "canonical"), tokenizer, table)
    )
    assert straddle in decoded.allowed()[0]
    assert straddle not in canonical.allowed()[0]
    decoded.advance(straddle)
    assert not decoded.finished and decoded.rejected_tokens == 0
    # After "b, " the next item starts: "a" (or "b", "bé"), never end of sequence.
    allowed = decoded.allowed()[0]
    assert tokenizer.token_to_id("a") in allowed and EOS not in allowed
    canonical.advance(straddle)
    assert canonical.finished and canonical.rejected_tokens == 1


def test_items_completed_inside_a_token_count_for_unique() -> None:
    tokenizer, table = toy()
    items = [("a", "a"), ("b", "b")]
    config = {"version": 1, "item_list": {"catalog": "cat", "separator": ", ", "unique": True}}
    ref = ReferenceConstraint(
        plan_for(config, tokenize(items, tokenizer, "decoded"), tokenizer, table)
    )
    ref.advance(tokenizer.token_to_id("b, "))
    allowed = ref.allowed()[0]
    assert tokenizer.token_to_id("b") not in allowed
    assert tokenizer.token_to_id("a") in allowed


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(case=item_lists(), seed=st.integers(0, 2**32 - 1))
def test_trie_walk_equals_per_token_simulation_and_outputs_parse(
    case: tuple[list[tuple[str, str]], dict[str, Any]], seed: int
) -> None:
    items, config = case
    plan = _decoded_plan(items, config)
    _, table = toy()
    rng = random.Random(seed)
    ref = ReferenceConstraint(plan)
    row = np.zeros(words_per_row(plan.vocab_size), dtype=np.int32)
    output: list[int] = []
    for _ in range(30):
        tokens, forced = ref.allowed()
        decoded = ref._decoded
        if ref.finished or decoded.cursor.where.name == "END":
            expected: tuple[list[int], bool] = ([EOS], False)
        else:
            simulated = [
                t for t, b in enumerate(table) if t != EOS and decoded.consume(b) is not None
            ]
            if decoded.end_allowed(decoded.cursor):
                simulated.append(EOS)
            expected = (simulated, False) if simulated else ([EOS], True)
        assert (sorted(tokens), forced) == (sorted(expected[0]), expected[1])
        ref.fill_row(row)
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")
        choices = np.flatnonzero(bits).tolist()
        assert choices, "a row is never all zero"
        token = rng.choice(choices)
        ref.advance(token)
        output.append(token)
        if ref.finished:
            break
    if ref.finished and output[-1] == EOS and ref.dead_ends == 0 and ref.rejected_tokens == 0:
        text = b"".join(table[t] or b"" for t in output[:-1])
        assert spells_valid_list(text, plan.item_list), text
