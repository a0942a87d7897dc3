"""Engine behaviour the property tests do not pin down: dead ends, compactness, threads."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from runtime.constraints import _engine
from runtime.constraints.catalog import (
    Catalog,
    TokenizedCatalog,
    load_catalog,
    tokenize_catalog,
    tokenizer_encoder,
)
from runtime.constraints.engine import ConstraintEngine, compile_catalog, compile_plan
from runtime.constraints.plan import ConstraintPlan, ItemListPlan, resolve_constraints
from runtime.constraints.schema import parse_constraints
from tests.constraints.conftest import WORDS
from tests.constraints.reference import ReferenceConstraint, words_per_row
from tests.constraints.toy import word_tokenizer

VOCAB = 40


def _token(word: str) -> int:
    return WORDS.index(word) + 2


def _allowed(row: np.ndarray) -> list[int]:
    return np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")).tolist()


def test_dead_end_forces_the_terminator_and_is_counted(toy_dir: Path) -> None:
    encode = tokenizer_encoder(word_tokenizer(WORDS))
    tokenized = tokenize_catalog(load_catalog(toy_dir / "catalogs", "films"), encode)
    config = {
        "version": 1,
        "item_list": {
            "catalog": "films",
            "separator": ";",
            "terminator": "]",
            "min_items": 3,
            "unique": True,
            "allow": ["f2", "f4"],
        },
    }
    plan = resolve_constraints(
        parse_constraints(config),
        catalogs=lambda name: tokenized,
        encode=encode,
        vocab_size=VOCAB,
        eos_token_id=0,
    )
    engine = ConstraintEngine(1, VOCAB, 1)
    engine.add(0, compile_plan(plan, compile_catalog(tokenized, VOCAB)))
    reference = ReferenceConstraint(plan)
    mask = np.zeros((1, words_per_row(VOCAB)), np.int32)
    expected = np.zeros(words_per_row(VOCAB), np.int32)
    for word in ["red", ";", "green"]:
        engine.fill(mask, np.asarray([0], np.int32))
        reference.fill_row(expected)
        assert _token(word) in _allowed(mask[0])
        engine.advance(0, [_token(word)])
        reference.advance(_token(word))
    # Both allowed items are used before min_items: the terminator is forced, never all-zero.
    engine.fill(mask, np.asarray([0], np.int32))
    reference.fill_row(expected)
    assert _allowed(mask[0]) == [_token("]")]
    np.testing.assert_array_equal(mask[0], expected)
    assert engine.slot_info(0)["dead_ends"] == 1 == reference.dead_ends
    assert engine.total_dead_ends == 1
    engine.advance(0, [_token("]"), 0])
    assert engine.slot_info(0) == {"dead_ends": 1, "rejected_tokens": 0, "finished": True}


def test_banned_everything_forces_eos() -> None:
    engine = ConstraintEngine(1, 33, 1)
    engine.add(0, _engine.Constraint.banned(5, list(range(33)), 33))
    mask = np.full((1, 2), 7, np.int32)
    engine.fill(mask, np.asarray([0], np.int32))
    assert _allowed(mask[0]) == [5]
    assert engine.total_dead_ends == 1


def _random_catalog(n: int, vocab: int, seed: int) -> TokenizedCatalog:
    rng = random.Random(seed)
    seqs = {tuple(rng.randrange(1, vocab) for _ in range(rng.randint(2, 8))) for _ in range(n)}
    ids = tuple(f"i{k}" for k in range(len(seqs)))
    catalog = Catalog("r", ids, ids, {i: k for k, i in enumerate(ids)})
    return TokenizedCatalog(catalog, tuple(seqs), {}, frozenset())


def test_catalog_trie_stays_within_64_bytes_per_token() -> None:
    tokenized = _random_catalog(20_000, 128_256, seed=1)
    native = compile_catalog(tokenized, 128_256)
    assert native.num_items == len(tokenized.tokens)
    assert native.num_tokens == tokenized.num_tokens
    assert native.memory_bytes / native.num_tokens <= 64


def test_one_and_many_threads_fill_the_same_masks() -> None:
    vocab = 1000
    tokenized = _random_catalog(300, 50, seed=2)
    native = compile_catalog(tokenized, vocab)
    rng = np.random.default_rng(3)
    masks = []
    for threads in (1, 3):
        engine = ConstraintEngine(64, vocab, threads)
        for slot in range(64):
            allowed = np.sort(rng.choice(native.num_items, 40, replace=False)).astype(np.int32)
            constraint = _engine.Constraint.item_list(
                native, [], [900], [901], 1, 4, True, allowed, 0, [], vocab
            )
            engine.add(slot, constraint)
        mask = np.zeros((64, engine.words), np.int32)
        engine.fill(mask, np.arange(64, dtype=np.int32), wait=False)
        engine.wait()
        masks.append(mask)
        rng = np.random.default_rng(3)
    np.testing.assert_array_equal(masks[0], masks[1])
    assert (masks[0] != 0).any(axis=1).all()


def test_engine_matches_reference_at_full_vocabulary_size() -> None:
    vocab, eos, sep, term = 128_256, 2, 10, 11
    tokenized = _random_catalog(5_000, 4_000, seed=4)  # tokens < 4,000: shared prefixes
    native = compile_catalog(tokenized, vocab)
    rng = random.Random(5)
    engine = ConstraintEngine(8, vocab, 2)
    refs = []
    for slot in range(8):
        allowed = tuple(sorted(rng.sample(range(native.num_items), 300)))
        item_list = ItemListPlan(tokenized, (12,), (sep,), (term,), 2, 4, True, allowed)
        plan = ConstraintPlan(vocab, eos, item_list, None, (7,))
        engine.add(slot, compile_plan(plan, native))
        refs.append(ReferenceConstraint(plan))
    mask = np.zeros((8, engine.words), np.int32)
    expected = np.zeros(engine.words, np.int32)
    for step in range(40):
        engine.fill(mask, np.arange(8, dtype=np.int32))
        for slot, ref in enumerate(refs):
            ref.fill_row(expected)
            np.testing.assert_array_equal(mask[slot], expected, err_msg=f"step {step} {slot}")
            token = rng.choice(_allowed(expected))
            ref.advance(token)
            engine.advance(slot, [token])


def test_a_list_allowing_every_item_starts_with_every_first_token() -> None:
    """Without an allow list the first row is the catalog's first tokens, also for a catalog
    compiled for a smaller vocabulary than the model's (its tokens fill a prefix of the row)."""
    vocab, eos, sep, term = 128_256, 2, 10, 11
    tokenized = _random_catalog(2_000, 4_000, seed=6)
    first_tokens = sorted({seq[0] for seq in tokenized.tokens})
    assert first_tokens[-1] >= 32 * 64  # past the row's first 64 words
    for catalog_vocab in (4_000, vocab):
        native = compile_catalog(tokenized, catalog_vocab)
        for unique in (False, True):
            item_list = ItemListPlan(tokenized, (), (sep,), (term,), 1, None, unique, None)
            engine = ConstraintEngine(1, vocab, 1)
            engine.add(0, compile_plan(ConstraintPlan(vocab, eos, item_list, None, ()), native))
            mask = np.zeros((1, engine.words), np.int32)
            engine.fill(mask, np.asarray([0], np.int32))
            assert _allowed(mask[0]) == first_tokens


def test_rows_under_a_wide_node_follow_what_is_still_available() -> None:
    """Item A alone and A followed by each of 100 tokens: the row after A lists exactly the
    children whose items remain (every child when nothing is used up or left out, fewer for
    a unique list after one is used, only the allowed ones under an allow list)."""
    vocab, a, sep, end = 256, 3, 1, 2
    children = list(range(100, 200))
    items = [[a], *[[a, t] for t in children]]
    offsets = np.cumsum([0, *map(len, items)], dtype=np.int64)
    catalog = _engine.Catalog(
        np.asarray([t for item in items for t in item], np.int32), offsets, vocab
    )
    allow_even = np.asarray([1 + k for k in range(0, 100, 2)], np.int32)  # items A,100 A,102 ..

    def row_after(tokens: list[int], unique: bool, allowed: np.ndarray | None) -> list[int]:
        constraint = _engine.Constraint.item_list(
            catalog, [], [sep], [end], 1, None, unique, allowed, 0, [], vocab
        )
        engine = ConstraintEngine(1, vocab, 1)
        engine.add(0, constraint)
        engine.advance(0, tokens)
        mask = np.zeros((1, words_per_row(vocab)), np.int32)
        engine.fill(mask, np.asarray([0], np.int32))
        return _allowed(mask[0])

    assert row_after([a], unique=False, allowed=None) == [sep, end, *children]
    used = [a, 150, sep, a]
    assert row_after(used, unique=True, allowed=None) == [
        sep,
        end,
        *(c for c in children if c != 150),
    ]
    assert row_after(used, unique=False, allowed=None) == [sep, end, *children]
    # A alone is not allowed: nothing may end there.
    assert row_after([a], unique=False, allowed=allow_even) == children[::2]
