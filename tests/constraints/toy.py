"""Small in-code tokenizers and catalogs for the constraint tests (no downloads)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from runtime.constraints.catalog import (
    CATALOG_DIR_ENV,
    load_catalog,
    tokenize_catalog,
    tokenizer_encoder,
)
from runtime.constraints.plan import ConstraintPlan, resolve_constraints
from runtime.constraints.schema import parse_constraints
from runtime.constraints.token_bytes import token_bytes_table

EOS = "</s>"


def word_tokenizer(words: Sequence[str]) -> Tokenizer:
    """A WordLevel tokenizer over ``words`` plus ``</s>`` (id 0) and ``<unk>`` (id 1)."""
    vocab = {EOS: 0, "<unk>": 1}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def write_catalog(directory: Path, name: str, items: Sequence[tuple[str, str]]) -> Path:
    path = directory / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in items))
    return path


def byte_level_tokenizer(
    corpus: Sequence[str], vocab_size: int = 400, extra: Sequence[str] = ()
) -> Tokenizer:
    """A byte-level BPE (GPT-2 style) trained in code on ``corpus``; ``</s>`` is id 0.

    Pre-tokenization keeps each text whole, so merges span items and separators the way real
    vocabularies' tokens straddle words and punctuation. ``extra`` strings become added
    (non-special) tokens.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    if extra:
        tokenizer.add_tokens(list(extra))
    return tokenizer


def open_list_rules() -> dict[str, Any]:
    """The arguments both native item-list constructors take after their delimiters, set to an
    open list (one item or more, any item, repeats allowed) with EOS 0 and nothing banned."""
    return {
        "min_items": 1,
        "max_items": None,
        "unique": False,
        "allowed": None,
        "eos_token_id": 0,
        "banned": [],
    }


def write_matching(directory: Path, name: str, matching: str) -> Path:
    """The sidecar that declares how catalog ``name`` is matched."""
    path = directory / f"{name}.meta.json"
    path.write_text(json.dumps({"matching": matching}))
    return path


@contextmanager
def catalog_model(
    items: Sequence[tuple[str, str]], tokenizer: Tokenizer, vocab: int, eos: int, matching: str
) -> Iterator[tuple[Path, Callable[[dict], ConstraintPlan]]]:
    """A temporary model folder (``tokenizer.json``, catalog ``cat`` in ``matching`` mode, set
    as ``LLM_SERVING_CATALOG_DIR``) and the function giving a configuration's reference plan."""
    encode = tokenizer_encoder(tokenizer)
    table = token_bytes_table(tokenizer, vocab)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tokenizer.save(str(root / "tokenizer.json"))
        write_catalog(root, "cat", items)
        write_matching(root, "cat", matching)
        with mock.patch.dict(os.environ, {CATALOG_DIR_ENV: str(root)}):
            tokenized = tokenize_catalog(load_catalog(root, "cat"), encode)

            def plan_of(config: dict) -> ConstraintPlan:
                return resolve_constraints(
                    parse_constraints(config),
                    catalogs=lambda name: tokenized,
                    encode=encode,
                    vocab_size=vocab,
                    eos_token_id=eos,
                    token_bytes=lambda: table,
                )

            yield root, plan_of
