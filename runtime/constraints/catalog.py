"""Catalogs: named JSONL files of ``{"id", "text"}`` items, tokenized once per process.

A catalog named ``films`` is the file ``films.jsonl`` in the catalog directory, which the
serving processes find through ``LLM_SERVING_CATALOG_DIR`` (the entrypoint prepares that folder
from the model package's manifest, linking ``<name>.jsonl`` to each catalog file). Versions
are part of the name (``films-2026-06``), so a new version is a new file.

A catalog is matched in one of two modes, declared per catalog in the package manifest and
carried into the catalog directory as a sidecar ``<name>.meta.json`` (``{"matching": ...}``):
``canonical`` (the default, also when the sidecar is absent) accepts the canonical tokenization
of each piece; ``decoded`` accepts every token sequence whose decoded bytes spell a valid list.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

__all__ = [
    "CATALOG_DIR_ENV",
    "MATCHING_MODES",
    "Catalog",
    "CatalogError",
    "FileStamp",
    "TokenizedCatalog",
    "catalog_dir_from_env",
    "catalog_stamps",
    "file_stamp",
    "load_catalog",
    "load_catalog_cached",
    "metadata_path",
    "read_catalog",
    "read_matching",
    "tokenize_catalog",
    "tokenizer_encoder",
]

#: Environment variable naming the directory that holds ``<name>.jsonl`` catalogs.
CATALOG_DIR_ENV = "LLM_SERVING_CATALOG_DIR"
#: How a catalog's items are matched: canonical tokens (default) or decoded bytes.
MATCHING_MODES = ("canonical", "decoded")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")

#: Turns texts into token ids, the canonical tokenization of each text on its own.
Encoder = Callable[[Sequence[str]], list[list[int]]]


class CatalogError(ValueError):
    """A catalog file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Catalog:
    """The items of one catalog file, in file order."""

    name: str
    ids: tuple[str, ...]
    texts: tuple[str, ...]
    index: dict[str, int] = field(repr=False, compare=False)
    #: One of :data:`MATCHING_MODES`.
    matching: str = "canonical"

    @cached_property
    def byte_continuations(self) -> dict[int, str]:
        """Each byte that follows a complete item's UTF-8 text inside a longer item, with that
        item's id (decoded mode: a separator or terminator starting with it is ambiguous)."""
        texts = sorted((t.encode("utf-8"), k) for k, t in enumerate(self.texts))
        found: dict[int, str] = {}
        # In sorted order every item that extends an item follows it contiguously.
        for i, (text, k) in enumerate(texts):
            for longer, _ in texts[i + 1 :]:
                if not longer.startswith(text):
                    break
                found.setdefault(longer[len(text)], self.ids[k])
        return found


@dataclass(frozen=True)
class TokenizedCatalog:
    """A catalog with the canonical token ids of every item (same order as ``catalog.ids``)."""

    catalog: Catalog
    tokens: tuple[tuple[int, ...], ...]
    #: Tokens that continue some item after another item is complete, with that item's id:
    #: a separator or terminator starting with one of them would make the list ambiguous.
    continuations: dict[int, str] = field(repr=False, compare=False)
    #: Every token id that occurs in some item.
    vocabulary: frozenset[int] = field(repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @cached_property
    def max_token(self) -> int:
        """The largest token id of :attr:`vocabulary` (read on every request, computed once)."""
        return max(self.vocabulary)


def catalog_dir_from_env() -> Path | None:
    """The catalog directory from ``LLM_SERVING_CATALOG_DIR``, or None when unset."""
    value = os.environ.get(CATALOG_DIR_ENV)
    return Path(value) if value else None


def load_catalog(directory: Path, name: str) -> Catalog:
    """Read ``<directory>/<name>.jsonl``; ids must be unique strings and texts non-empty."""
    if not _NAME.match(name):
        raise CatalogError(
            f"catalog name {name!r} must use letters, digits, '.', '_', '@' or '-' only"
        )
    path = directory / f"{name}.jsonl"
    if not path.is_file():
        available = sorted(p.stem for p in directory.glob("*.jsonl")) if directory.is_dir() else []
        raise CatalogError(
            f"unknown catalog {name!r}: no file {path}; available: {', '.join(available) or 'none'}"
        )
    catalog = read_catalog(path, name)
    meta = metadata_path(directory, name)
    if meta.is_file():
        catalog = replace(catalog, matching=read_matching(meta))
    return catalog


def metadata_path(directory: Path, name: str) -> Path:
    """The sidecar ``<name>.meta.json`` beside ``<name>.jsonl`` that declares its matching mode."""
    return directory / f"{name}.meta.json"


def read_matching(path: Path) -> str:
    """The ``matching`` mode declared in a catalog sidecar file (default ``canonical``)."""
    try:
        value: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CatalogError(f"{path}: cannot read the catalog metadata: {exc}") from None
    if not isinstance(value, dict) or not set(value) <= {"matching"}:
        raise CatalogError(f'{path}: expected an object with the only key "matching"')
    matching = value.get("matching", "canonical")
    if matching not in MATCHING_MODES:
        raise CatalogError(
            f"{path}: field 'matching' must be one of {', '.join(MATCHING_MODES)}, got {matching!r}"
        )
    return str(matching)


def read_catalog(path: Path, name: str) -> Catalog:
    """Parse one catalog file (JSONL of ``{"id", "text"}``) under ``name``, wherever it lives.

    Packaging checks a package's catalogs with it, so a catalog the engine cannot read is
    refused when the package is built, not when the first request names it.
    """
    ids: list[str] = []
    texts: list[str] = []
    index: dict[str, int] = {}
    seen_texts: dict[str, str] = {}
    try:
        lines = path.open(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"cannot read catalog {name!r} at {path}: {exc.strerror}") from exc
    with lines:
        try:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                item_id, text = _parse_line(path, number, line)
                if item_id in index:
                    raise CatalogError(f"{path}:{number}: duplicate id {item_id!r}")
                if text in seen_texts:
                    raise CatalogError(
                        f"{path}:{number}: item {item_id!r} has the same text as "
                        f"{seen_texts[text]!r}"
                    )
                index[item_id] = len(ids)
                seen_texts[text] = item_id
                ids.append(item_id)
                texts.append(text)
        except UnicodeDecodeError as exc:
            raise CatalogError(f"{path}: not UTF-8 text: {exc}") from None
    if not ids:
        raise CatalogError(f"{path}: the catalog has no items")
    return Catalog(name=name, ids=tuple(ids), texts=tuple(texts), index=index)


def _parse_line(path: Path, number: int, line: str) -> tuple[str, str]:
    try:
        row: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CatalogError(f"{path}:{number}: not valid JSON: {exc}") from None
    if not isinstance(row, dict) or set(row) != {"id", "text"}:
        raise CatalogError(f'{path}:{number}: expected an object with keys "id" and "text"')
    item_id, text = row["id"], row["text"]
    if not isinstance(item_id, str) or not item_id:
        raise CatalogError(f"{path}:{number}: id must be a non-empty string")
    if not isinstance(text, str) or not text:
        raise CatalogError(f"{path}:{number}: text of {item_id!r} must be a non-empty string")
    # JSON escapes can spell lone surrogates ("\ud800"), which no tokenizer can encode: refused
    # here, the package build refuses the catalog instead of a request failing in the engine.
    for name, value in (("id", item_id), ("text", text)):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CatalogError(
                f"{path}:{number}: {name} {value!r} is not valid Unicode: character "
                f"{exc.start} is a lone surrogate; write the character itself or an escaped "
                "surrogate pair"
            ) from None
    return item_id, text


#: A file's inode, size, mtime and ctime (all -1 when it cannot be read): it changes when the
#: file is rewritten or replaced.
FileStamp = tuple[int, int, int, int]


def file_stamp(path: Path) -> FileStamp:
    """What tells that ``path`` changed since it was read."""
    # Not the mtime alone: the kernel moves it in ticks of milliseconds, and a file rewritten
    # (or replaced) within the tick it was read in would otherwise stay cached as it was.
    try:
        st = path.stat()
    except OSError:
        return (-1, -1, -1, -1)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def catalog_stamps(directory: Path, name: str) -> tuple[FileStamp, ...]:
    """The stamps of a catalog's file and sidecar; while the file is missing, also of the
    directory, whose listing the error names."""
    stamps = (file_stamp(directory / f"{name}.jsonl"), file_stamp(metadata_path(directory, name)))
    return stamps if stamps[0][0] != -1 else (*stamps, file_stamp(directory))


@lru_cache(maxsize=64)
def _load_cached(
    directory: Path, name: str, stamps: tuple[FileStamp, ...]
) -> Catalog | CatalogError:
    # A failure is kept too, under the stamps taken before the read: a burst of requests for a
    # broken catalog reads it once, and a fixed (or any rewritten) file is read again.
    try:
        return load_catalog(directory, name)
    except CatalogError as exc:
        return CatalogError(str(exc))  # without the traceback, which holds the read's frames


def load_catalog_cached(directory: Path, name: str) -> Catalog:
    """``load_catalog`` cached per process, failures included; a rewritten or replaced file is
    read again."""
    found = _load_cached(directory, name, catalog_stamps(directory, name))
    if isinstance(found, CatalogError):
        raise CatalogError(str(found))
    return found


def tokenizer_encoder(tokenizer: Any) -> Encoder:
    """An encoder over a ``tokenizers.Tokenizer`` or a Hugging Face tokenizer, no special tokens."""
    if hasattr(tokenizer, "encode_batch"):

        def encode_fast(texts: Sequence[str]) -> list[list[int]]:
            encoded = tokenizer.encode_batch(list(texts), add_special_tokens=False)
            return [list(e.ids) for e in encoded]

        return encode_fast
    if hasattr(tokenizer, "encode"):

        def encode_hf(texts: Sequence[str]) -> list[list[int]]:
            return [list(tokenizer.encode(t, add_special_tokens=False)) for t in texts]

        return encode_hf
    raise TypeError(f"cannot tokenize with {type(tokenizer).__name__}: it has no encode method")


def tokenize_catalog(catalog: Catalog, encode: Encoder) -> TokenizedCatalog:
    """Tokenize every item on its own (the canonical tokenization) and find continuations."""
    tokens = tuple(tuple(ids) for ids in encode(catalog.texts))
    by_tokens: dict[tuple[int, ...], str] = {}
    for item_id, seq in zip(catalog.ids, tokens, strict=True):
        if not seq:
            raise CatalogError(f"catalog {catalog.name!r}: item {item_id!r} tokenizes to nothing")
        if seq in by_tokens:
            raise CatalogError(
                f"catalog {catalog.name!r}: items {by_tokens[seq]!r} and {item_id!r} tokenize "
                "to the same tokens"
            )
        by_tokens[seq] = item_id
    continuations: dict[int, str] = {}
    for seq in tokens:
        for cut in range(1, len(seq)):
            owner = by_tokens.get(seq[:cut])
            if owner is not None:
                continuations.setdefault(seq[cut], owner)
    vocabulary = frozenset(t for seq in tokens for t in seq)
    return TokenizedCatalog(
        catalog=catalog, tokens=tokens, continuations=continuations, vocabulary=vocabulary
    )
