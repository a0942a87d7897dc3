"""The decoded bytes of every vocabulary token, for catalogs matched in ``decoded`` mode.

Decoded-mode output is the concatenation of its tokens' bytes, so each token needs its byte
string: byte-level BPE pieces map back through GPT-2's ``bytes_to_unicode`` table,
sentencepiece pieces turn ``▁`` into a space and ``<0xNN>`` into the byte NN, other models
use the piece's UTF-8. Special tokens have no bytes (``None``): they never spell text.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

__all__ = ["TokenBytes", "byte_level_alphabet", "token_bytes_table"]

#: ``table[token_id]`` is the token's bytes, or None for special and unused ids.
TokenBytes = tuple[bytes | None, ...]

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_METASPACE = "\u2581"


@lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode`` inverted: the printable character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _component_types(config: Any) -> set[str]:
    """Every ``type`` named in a tokenizer.json component, sequences included."""
    found: set[str] = set()
    stack = [config]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("type"), str):
                found.add(item["type"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _decode_piece(piece: str, kind: str) -> bytes | None:
    if kind == "byte_level":
        alphabet = byte_level_alphabet()
        if all(c in alphabet for c in piece):
            return bytes(alphabet[c] for c in piece)
        return piece.encode("utf-8")
    if kind == "metaspace":
        fallback = _BYTE_FALLBACK.match(piece)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        return piece.replace(_METASPACE, " ").encode("utf-8")
    return piece.encode("utf-8")


def token_bytes_table(tokenizer: Any, vocab_size: int) -> TokenBytes:
    """The bytes of token ids ``0..vocab_size-1`` for a ``tokenizers.Tokenizer`` (or a Hugging
    Face fast tokenizer, through its ``backend_tokenizer``); ids past the tokenizer are None."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    config = json.loads(backend.to_str())
    types = _component_types(config.get("decoder")) | _component_types(config.get("pre_tokenizer"))
    if "ByteLevel" in types:
        kind = "byte_level"
    elif (
        "Metaspace" in types
        or "ByteFallback" in types
        or config.get("model", {}).get("byte_fallback")
    ):
        kind = "metaspace"
    else:
        kind = "plain"
    table: list[bytes | None] = [None] * vocab_size
    for piece, token in backend.get_vocab(with_added_tokens=False).items():
        if 0 <= token < vocab_size:
            table[token] = _decode_piece(piece, kind) or None
    for token, added in backend.get_added_tokens_decoder().items():
        if 0 <= token < vocab_size:
            table[token] = None if added.special else (added.content.encode("utf-8") or None)
    return tuple(table)
