"""Small in-code tokenizers and catalogs for the constraint tests (no downloads)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

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
