"""Shared pieces of the decoded-mode tests: a byte-level toy vocabulary, plans, an output check."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from tokenizers import Tokenizer

from runtime.constraints.catalog import TokenizedCatalog, load_catalog, tokenize_catalog
from runtime.constraints.catalog import tokenizer_encoder as encoder_of
from runtime.constraints.plan import ConstraintPlan, ItemListPlan, resolve_constraints
from runtime.constraints.schema import parse_constraints
from runtime.constraints.token_bytes import TokenBytes, token_bytes_table
from tests.constraints.toy import byte_level_tokenizer, write_catalog, write_matching

#: Item texts: prefixes of one another, multi-byte UTF-8, spaces and bytes the pieces share.
WORDS = ["a", "ab", "abc", "b", "bé", "é", "日本", "日", "x y", "a;"]
SEPARATORS = [", ", ";", " | ", "é/"]
PREFIXES = ["", "[", "list: "]
TERMINATORS = ["", "]", ".", " end"]
EOS = 0


def _corpus(seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(400):
        sep = rng.choice(SEPARATORS)
        body = sep.join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
        out.append(rng.choice(PREFIXES) + body + rng.choice(TERMINATORS))
    return out


def toy_tokenizer() -> Tokenizer:
    """A byte-level BPE over lists of WORDS, plus the straddling tokens ``"b, "``, ``"a, a, "``."""
    return byte_level_tokenizer(_corpus(), vocab_size=420, extra=["b, ", "a, a, "])


def tokenize(items: Sequence[tuple[str, str]], tokenizer: Tokenizer, matching: str):
    """Write the catalog ``cat`` with its sidecar in a temp dir and tokenize it."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_catalog(root, "cat", items)
        write_matching(root, "cat", matching)
        return tokenize_catalog(load_catalog(root, "cat"), encoder_of(tokenizer))


def plan_for(
    config: dict[str, Any], tokenized: TokenizedCatalog, tokenizer: Tokenizer, table: TokenBytes
) -> ConstraintPlan:
    return resolve_constraints(
        parse_constraints(config),
        catalogs=lambda name: tokenized,
        encode=encoder_of(tokenizer),
        vocab_size=len(table),
        eos_token_id=EOS,
        token_bytes=lambda: table,
    )


def table_of(tokenizer: Tokenizer) -> TokenBytes:
    return token_bytes_table(tokenizer, tokenizer.get_vocab_size())


def spells_valid_list(text: bytes, spec: ItemListPlan) -> bool:
    """Whether ``text`` is prefix item (separator item)* terminator under ``spec``'s options,
    by trying every split (independent of the state machines under test)."""
    catalog = spec.catalog.catalog
    indices = range(len(catalog.texts)) if spec.allowed is None else spec.allowed
    items = {catalog.texts[k].encode("utf-8") for k in indices}
    prefix, sep, term = spec.prefix_bytes, spec.separator_bytes, spec.terminator_bytes
    if not text.startswith(prefix) or not text.endswith(term):
        return False
    body = text[len(prefix) : len(text) - len(term)]

    def rest_ok(rest: bytes, count: int, used: frozenset[bytes]) -> bool:
        for item in items:
            if not rest.startswith(item) or (spec.unique and item in used):
                continue
            after, k = rest[len(item) :], count + 1
            if spec.max_items is not None and k > spec.max_items:
                continue
            if not after and k >= spec.min_items:
                return True
            if after.startswith(sep) and rest_ok(after[len(sep) :], k, used | {item}):
                return True
        return False

    return rest_ok(body, 0, frozenset())


@lru_cache(maxsize=1)
def toy() -> tuple[Tokenizer, TokenBytes]:
    """The toy tokenizer and its token bytes, built once per process."""
    tokenizer = toy_tokenizer()
    return tokenizer, table_of(tokenizer)


@st.composite
def item_lists(draw: st.DrawFn, vocab: int = 420) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    texts = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=7, unique=True))
    items = [(f"i{k}", t) for k, t in enumerate(texts)]
    ids = [i for i, _ in items]
    min_items = draw(st.integers(1, 3))
    spec: dict[str, Any] = {
        "catalog": "cat",
        "prefix": draw(st.sampled_from(PREFIXES)),
        "separator": draw(st.sampled_from(SEPARATORS)),
        "terminator": draw(st.sampled_from(TERMINATORS)),
        "min_items": min_items,
        "max_items": draw(st.none() | st.integers(min_items, 5)),
        "unique": draw(st.booleans()),
    }
    if draw(st.booleans()):
        spec["allow"] = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids)))
    if draw(st.booleans()):
        spec["deny"] = draw(st.lists(st.sampled_from(ids), max_size=2))
    config: dict[str, Any] = {"version": 1, "item_list": spec}
    if draw(st.integers(0, 4)) == 0:
        config["banned_tokens"] = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=40))
    return items, config
