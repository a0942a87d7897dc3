"""Small in-code tokenizers and catalogs for the constraint tests (no downloads)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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


def write_matching(directory: Path, name: str, matching: str) -> Path:
    """The sidecar that declares how catalog ``name`` is matched."""
    path = directory / f"{name}.meta.json"
    path.write_text(json.dumps({"matching": matching}))
    return path
