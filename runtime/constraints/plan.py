"""Resolve a validated constraint spec against catalogs and a tokenizer into token-level plans.

The plan is what both the engine and the Python reference execute, so every check that needs
the catalog, the tokenizer or the vocabulary happens here and raises
:class:`~runtime.constraints.schema.ConstraintConfigError` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runtime.constraints.catalog import (
    Catalog,
    CatalogError,
    Encoder,
    TokenizedCatalog,
    load_catalog_cached,
)
from runtime.constraints.schema import (
    ConstraintConfigError,
    ConstraintSpec,
    ItemListSpec,
    TokenMachineSpec,
)
from runtime.constraints.token_bytes import TokenBytes

__all__ = [
    "ConstraintPlan",
    "ItemListPlan",
    "MachinePlan",
    "check_catalog_fields",
    "resolve_constraints",
]


@dataclass(frozen=True)
class ItemListPlan:
    """An item list in token ids; ``allowed`` holds catalog indices (None: every item)."""

    catalog: TokenizedCatalog
    prefix: tuple[int, ...]
    separator: tuple[int, ...]
    #: Empty means the list ends with end of sequence.
    terminator: tuple[int, ...]
    min_items: int
    max_items: int | None
    unique: bool
    allowed: tuple[int, ...] | None
    #: ``canonical`` (the token fields above) or ``decoded`` (the byte fields below).
    matching: str = "canonical"
    prefix_bytes: bytes = b""
    separator_bytes: bytes = b""
    terminator_bytes: bytes = b""
    #: Decoded mode: the bytes of every token id (None: special, never allowed).
    token_bytes: TokenBytes | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, eq=False)
class MachinePlan:
    """A deterministic token automaton over ``[state, token, next_state]`` rows."""

    num_states: int
    initial_state: int
    accepting: frozenset[int]
    #: int32 rows of shape (n, 3), read-only: the engine's input as is.
    transitions: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class ConstraintPlan:
    """One request's constraint: a rule (or none), minus banned tokens, over ``vocab_size``."""

    vocab_size: int
    eos_token_id: int
    item_list: ItemListPlan | None
    machine: MachinePlan | None
    banned: tuple[int, ...]


def _catalog_for(spec: ItemListSpec, load: Callable[[str], Catalog]) -> Catalog:
    try:
        return load(spec.catalog)
    except CatalogError as exc:
        raise ConstraintConfigError("constraints.item_list.catalog", str(exc)) from None


def _check_ids(spec: ItemListSpec, catalog: Catalog) -> None:
    for name, ids in (("allow", spec.allow or []), ("deny", spec.deny)):
        for i, item_id in enumerate(ids):
            if item_id not in catalog.index:
                raise ConstraintConfigError(
                    f"constraints.item_list.{name}[{i}]",
                    f"item id {item_id!r} is not in catalog {catalog.name!r}",
                )


def check_catalog_fields(spec: ConstraintSpec, catalog_dir: Path | None) -> None:
    """The checks that need only the catalog files: the catalog exists, allow/deny ids exist."""
    if spec.item_list is None:
        return
    if catalog_dir is None:
        raise ConstraintConfigError(
            "constraints.item_list.catalog",
            "no catalog directory is configured on this server (LLM_SERVING_CATALOG_DIR)",
        )
    catalog = _catalog_for(spec.item_list, lambda name: load_catalog_cached(catalog_dir, name))
    _check_ids(spec.item_list, catalog)
    if catalog.matching == "decoded":
        _decoded_pieces(spec.item_list, catalog)


def _check_tokens(field: str, tokens: tuple[int, ...], vocab_size: int, eos: int) -> None:
    for token in tokens:
        if token >= vocab_size:
            raise ConstraintConfigError(
                field, f"tokenizes to token {token}, outside the vocabulary of {vocab_size}"
            )
        if token == eos:
            raise ConstraintConfigError(field, "contains the end-of-sequence token")


def _item_list_plan(
    spec: ItemListSpec,
    catalogs: Callable[[str], TokenizedCatalog],
    encode: Encoder,
    vocab_size: int,
    eos: int,
    token_bytes: Callable[[], TokenBytes] | None,
) -> ItemListPlan:
    try:
        tokenized = catalogs(spec.catalog)
    except CatalogError as exc:
        raise ConstraintConfigError("constraints.item_list.catalog", str(exc)) from None
    catalog = tokenized.catalog
    _check_ids(spec, catalog)
    allowed: tuple[int, ...] | None = None
    if spec.allow is not None or spec.deny:
        deny = {catalog.index[i] for i in spec.deny}
        base = (catalog.index[i] for i in spec.allow) if spec.allow else range(len(catalog.ids))
        allowed = tuple(sorted({i for i in base if i not in deny}))
    if catalog.matching == "decoded":
        if token_bytes is None:
            raise ConstraintConfigError(
                "constraints.item_list.catalog",
                f"catalog {catalog.name!r} is matched on decoded text, which needs the "
                "tokenizer's token bytes; none were given",
            )
        return _decoded_plan(spec, tokenized, allowed, token_bytes(), vocab_size)
    prefix, separator, terminator = (
        tuple(ids) if text else () for text, ids in zip(*_encode_pieces(spec, encode), strict=True)
    )
    for name, tokens in (("prefix", prefix), ("separator", separator), ("terminator", terminator)):
        _check_tokens(f"constraints.item_list.{name}", tokens, vocab_size, eos)
    if not separator:
        raise ConstraintConfigError("constraints.item_list.separator", "tokenizes to no tokens")
    term_first = terminator[0] if terminator else eos
    if separator[0] == term_first:
        raise ConstraintConfigError(
            "constraints.item_list.terminator",
            f"terminator and separator both start with token {term_first}; after an item the "
            "next token must say which one follows",
        )
    for name, token in (("separator", separator[0]), ("terminator", term_first)):
        owner = tokenized.continuations.get(token)
        if owner is not None:
            raise ConstraintConfigError(
                f"constraints.item_list.{name}",
                f"its first token {token} also continues catalog item {owner!r} into a longer "
                f"item of catalog {catalog.name!r}; choose a {name} that cannot continue an item",
            )
    if tokenized.max_token >= vocab_size or eos in tokenized.vocabulary:
        raise ConstraintConfigError(
            "constraints.item_list.catalog",
            f"catalog {catalog.name!r} has tokens outside the vocabulary of {vocab_size} "
            "or the end-of-sequence token; was it tokenized with this model's tokenizer?",
        )
    return ItemListPlan(
        catalog=tokenized,
        prefix=prefix,
        separator=separator,
        terminator=terminator,
        min_items=spec.min_items,
        max_items=spec.max_items,
        unique=spec.unique,
        allowed=allowed,
    )


def _decoded_pieces(spec: ItemListSpec, catalog: Catalog) -> tuple[bytes, bytes]:
    """Separator and terminator as UTF-8, checked so that each byte says where the list is."""
    separator = spec.separator.encode("utf-8")
    terminator = spec.terminator.encode("utf-8")
    if terminator and terminator[0] == separator[0]:
        raise ConstraintConfigError(
            "constraints.item_list.terminator",
            f"terminator and separator both start with {chr(separator[0])!r} (byte "
            f"{separator[0]}); after an item the next byte must say which one follows",
        )
    for field_name, piece in (("separator", separator), ("terminator", terminator)):
        owner = catalog.byte_continuations.get(piece[0]) if piece else None
        if owner is not None:
            raise ConstraintConfigError(
                f"constraints.item_list.{field_name}",
                f"its first byte {piece[0]} also continues catalog item {owner!r} into a longer "
                f"item of catalog {catalog.name!r}; choose a {field_name} that cannot continue an "
                "item",
            )
    return separator, terminator


def _decoded_plan(
    spec: ItemListSpec,
    tokenized: TokenizedCatalog,
    allowed: tuple[int, ...] | None,
    table: TokenBytes,
    vocab_size: int,
) -> ItemListPlan:
    """Decoded mode: the pieces as UTF-8, checked so that each byte says where the list is."""
    if len(table) != vocab_size:
        raise ConstraintConfigError(
            "constraints.item_list.catalog",
            f"the token byte table has {len(table)} entries for a vocabulary of {vocab_size}",
        )
    separator, terminator = _decoded_pieces(spec, tokenized.catalog)
    return ItemListPlan(
        catalog=tokenized,
        prefix=(),
        separator=(),
        terminator=(),
        min_items=spec.min_items,
        max_items=spec.max_items,
        unique=spec.unique,
        allowed=allowed,
        matching="decoded",
        prefix_bytes=spec.prefix.encode("utf-8"),
        separator_bytes=separator,
        terminator_bytes=terminator,
        token_bytes=table,
    )


def _encode_pieces(spec: ItemListSpec, encode: Encoder) -> tuple[list[str], list[list[int]]]:
    texts = [spec.prefix, spec.separator, spec.terminator]
    present = [t for t in texts if t]
    encoded = iter(encode(present))
    return texts, [next(encoded) if t else [] for t in texts]


def _machine_plan(spec: TokenMachineSpec, vocab_size: int, eos: int) -> MachinePlan:
    """The machine with its token ids checked against the vocabulary, all rows at once."""
    tokens = spec.transitions[:, 1]
    outside = tokens >= vocab_size
    bad = outside | (tokens == eos)
    if bad.any():
        i = int(np.argmax(bad))
        where = f"constraints.token_machine.transitions[{i}]"
        token = int(tokens[i])
        if outside[i]:
            raise ConstraintConfigError(
                where, f"token {token} is outside the vocabulary of {vocab_size}"
            )
        raise ConstraintConfigError(
            where, f"token {token} is end of sequence, which only accepting_states allow"
        )
    # Every value is now below the vocabulary size or num_states, so int32 holds it.
    transitions = spec.transitions.astype(np.int32)
    transitions.flags.writeable = False
    return MachinePlan(
        num_states=spec.num_states,
        initial_state=spec.initial_state,
        accepting=frozenset(spec.accepting_states),
        transitions=transitions,
    )


def resolve_constraints(
    spec: ConstraintSpec,
    *,
    catalogs: Callable[[str], TokenizedCatalog],
    encode: Encoder,
    vocab_size: int,
    eos_token_id: int,
    token_bytes: Callable[[], TokenBytes] | None = None,
) -> ConstraintPlan:
    """Turn ``spec`` into token ids for a model with ``vocab_size`` logits.

    ``token_bytes`` gives the vocabulary's byte table; only catalogs matched in decoded mode
    call it.
    """
    if not 0 <= eos_token_id < vocab_size:
        raise ConstraintConfigError(
            "constraints", f"end-of-sequence token {eos_token_id} is outside the vocabulary"
        )
    item_list = None
    if spec.item_list is not None:
        item_list = _item_list_plan(
            spec.item_list, catalogs, encode, vocab_size, eos_token_id, token_bytes
        )
    machine = None
    if spec.token_machine is not None:
        machine = _machine_plan(spec.token_machine, vocab_size, eos_token_id)
    for i, token in enumerate(spec.banned_tokens or ()):
        if token >= vocab_size:
            raise ConstraintConfigError(
                f"constraints.banned_tokens[{i}]",
                f"token {token} is outside the vocabulary of {vocab_size}",
            )
    return ConstraintPlan(
        vocab_size=vocab_size,
        eos_token_id=eos_token_id,
        item_list=item_list,
        machine=machine,
        banned=tuple(sorted(set(spec.banned_tokens or ()))),
    )
