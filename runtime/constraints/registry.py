"""Per-process catalog registry: load, tokenize and compile each catalog once, on first use."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from runtime.constraints import _engine
from runtime.constraints.catalog import (
    CatalogError,
    Encoder,
    TokenizedCatalog,
    load_catalog,
    tokenize_catalog,
)
from runtime.constraints.engine import compile_catalog

__all__ = ["CatalogRegistry", "CompiledCatalog"]


@dataclass(frozen=True)
class CompiledCatalog:
    """A catalog's tokens (for plans and the reference) and its compiled engine trie."""

    tokenized: TokenizedCatalog
    native: _engine.Catalog


class CatalogRegistry:
    """Catalogs of one directory for one tokenizer and vocabulary, shared by all requests."""

    def __init__(self, directory: Path | None, encode: Encoder, vocab_size: int) -> None:
        self._directory = directory
        self._encode = encode
        self._vocab_size = vocab_size
        self._compiled: dict[str, CompiledCatalog] = {}
        self._lock = threading.Lock()

    @property
    def encode(self) -> Encoder:
        return self._encode

    def get(self, name: str) -> CompiledCatalog:
        """The compiled catalog ``name``; raises :class:`CatalogError` when it cannot load."""
        with self._lock:
            found = self._compiled.get(name)
            if found is None:
                if self._directory is None:
                    raise CatalogError(
                        "no catalog directory is configured (set LLM_SERVING_CATALOG_DIR)"
                    )
                tokenized = tokenize_catalog(load_catalog(self._directory, name), self._encode)
                found = CompiledCatalog(tokenized, compile_catalog(tokenized, self._vocab_size))
                self._compiled[name] = found
            return found

    def tokenized(self, name: str) -> TokenizedCatalog:
        return self.get(name).tokenized
