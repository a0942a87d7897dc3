"""Per-process catalog registry: load, tokenize and compile each catalog once, on first use."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runtime.constraints import _engine
from runtime.constraints.catalog import (
    CatalogError,
    Encoder,
    FileStamp,
    TokenizedCatalog,
    catalog_stamps,
    load_catalog_cached,
    tokenize_catalog,
)
from runtime.constraints.engine import compile_byte_catalog, compile_catalog, compile_vocabulary
from runtime.constraints.token_bytes import TokenBytes

__all__ = ["CatalogRegistry", "CompiledCatalog"]

#: Failed catalog names remembered at once: requests may name any number of unknown ones.
_MAX_FAILURES = 64


@dataclass(frozen=True)
class CompiledCatalog:
    """A catalog's tokens (for plans and the reference) and its compiled engine trie (over
    token ids, or over the items' bytes for a catalog matched in decoded mode)."""

    tokenized: TokenizedCatalog
    native: _engine.Catalog


class CatalogRegistry:
    """Catalogs of one directory for one tokenizer and vocabulary, shared by all requests."""

    def __init__(
        self,
        directory: Path | None,
        encode: Encoder,
        vocab_size: int,
        token_bytes: Callable[[], TokenBytes] | None = None,
    ) -> None:
        self._directory = directory
        self._encode = encode
        self._vocab_size = vocab_size
        self._token_bytes_source = token_bytes
        self._compiled: dict[str, CompiledCatalog] = {}
        #: Each failed name's error, under the stamps of its files before the failed read.
        self._failures: OrderedDict[str, tuple[tuple[FileStamp, ...], str]] = OrderedDict()
        self._table: TokenBytes | None = None
        self._vocabulary: _engine.Vocabulary | None = None
        self._lock = threading.Lock()
        self._vocabulary_lock = threading.Lock()

    def token_bytes(self) -> TokenBytes:
        """The vocabulary's token bytes, built once on first use (decoded catalogs need them)."""
        with self._vocabulary_lock:
            if self._table is None:
                if self._token_bytes_source is None:
                    raise CatalogError("this server has no tokenizer to decode token bytes with")
                self._table = self._token_bytes_source()
            return self._table

    def vocabulary(self) -> _engine.Vocabulary:
        """The engine's byte trie of the vocabulary, compiled once per process."""
        table = self.token_bytes()
        with self._vocabulary_lock:
            if self._vocabulary is None:
                self._vocabulary = compile_vocabulary(table)
            return self._vocabulary

    @property
    def encode(self) -> Encoder:
        return self._encode

    def get(self, name: str) -> CompiledCatalog:
        """The compiled catalog ``name``; raises :class:`CatalogError` when it cannot load.

        A failure is kept until the catalog's files change: each request for a broken catalog
        ends in the engine's loop, which should not read and tokenize it again every time.
        """
        with self._lock:
            found = self._compiled.get(name)
            if found is None:
                found = self._compile(name)
                self._compiled[name] = found
            return found

    def _compile(self, name: str) -> CompiledCatalog:
        if self._directory is None:
            raise CatalogError("no catalog directory is configured (set LLM_SERVING_CATALOG_DIR)")
        stamps = catalog_stamps(self._directory, name)
        failed = self._failures.get(name)
        if failed is not None and failed[0] == stamps:
            raise CatalogError(failed[1])
        try:
            tokenized = tokenize_catalog(load_catalog_cached(self._directory, name), self._encode)
        except CatalogError as exc:
            self._failures[name] = (stamps, str(exc))
            self._failures.move_to_end(name)
            if len(self._failures) > _MAX_FAILURES:
                self._failures.popitem(last=False)
            raise
        self._failures.pop(name, None)
        if tokenized.catalog.matching == "decoded":
            return CompiledCatalog(tokenized, compile_byte_catalog(tokenized))
        return CompiledCatalog(tokenized, compile_catalog(tokenized, self._vocab_size))

    def tokenized(self, name: str) -> TokenizedCatalog:
        return self.get(name).tokenized
