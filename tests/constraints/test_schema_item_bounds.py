"""``min_items`` / ``max_items`` are bounded by what the engine counts (32 bits): a larger value
is a 400 naming the field, and the largest accepted one compiles in the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.constraints.batch import ConstraintBatch
from runtime.constraints.catalog import tokenizer_encoder
from runtime.constraints.registry import CatalogRegistry
from runtime.constraints.schema import (
    MAX_LIST_ITEMS,
    ConstraintConfigError,
    constraints_json_schema,
    parse_constraints,
)
from tests.constraints.toy import word_tokenizer, write_catalog


def _config(**item_list: object) -> dict[str, object]:
    return {"version": 1, "item_list": {"catalog": "films", "separator": ";", **item_list}}


@pytest.mark.parametrize("field", ["min_items", "max_items"])
@pytest.mark.parametrize("value", [2**32, 2**63, 10**30])
def test_a_bound_beyond_32_bits_is_refused_naming_the_field(field: str, value: int) -> None:
    with pytest.raises(ConstraintConfigError) as err:
        parse_constraints(_config(**{field: value}))
    assert err.value.field == f"constraints.item_list.{field}"
    assert str(MAX_LIST_ITEMS) in str(err.value)


def test_the_json_schema_states_the_bound() -> None:
    fields = constraints_json_schema()["$defs"]["ItemListSpec"]["properties"]
    assert fields["min_items"]["maximum"] == MAX_LIST_ITEMS == 2**32 - 1
    assert fields["max_items"]["anyOf"][0]["maximum"] == MAX_LIST_ITEMS


def test_the_largest_bounds_compile_in_the_engine(tmp_path: Path) -> None:
    write_catalog(tmp_path, "films", [("a", "red"), ("b", "green")])
    vocab = 8
    batch = ConstraintBatch(
        max_batch=2,
        vocab_size=vocab,
        registry=CatalogRegistry(
            tmp_path, tokenizer_encoder(word_tokenizer(["red", "green", ";"])), vocab
        ),
        default_eos_token_id=0,
    )
    for slot, bounds in enumerate(
        [{"max_items": MAX_LIST_ITEMS}, {"min_items": MAX_LIST_ITEMS, "max_items": None}]
    ):
        config = _config(**bounds)
        parse_constraints(config)
        batch.add(slot, config, [], 0)
    assert batch.rejected_requests == 0
