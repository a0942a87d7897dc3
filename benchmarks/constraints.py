"""Per-step cost of catalog item-list constraints: Python reference, the engine, xgrammar.

Workload (synthetic, built in code): a vocabulary of 128,256 tokens, a catalog of 100,000
items of 2-7 tokens, per-request allow lists of 2,000 and 50,000 items, ``unique``, 1 to 10
items per output. Every request replays a valid output token by token; a step is advancing
each request by its next token and filling the whole batch's next-token bitmask. xgrammar
runs the same kind of output over a 10,000-item catalog written as an EBNF alternation (it
has no per-request allow lists and cannot forbid repeats).

``engine_mask`` rows time what a CPU engine does with the bitmask next: setting every masked
token's float32 logit to -inf in a ``[batch, 128,256]`` array (``mask_logits``), the step that
fills the bitmask untimed.

Decoded matching (``mode: decoded`` rows) runs the same requests over the same catalog with
the items as text: the vocabulary's tokens get byte strings (syllable words, the 256 single
bytes, punctuation), the items are their tokens' text, and the engine walks the vocabulary's
byte trie jointly with the catalog's byte trie each step.

    python -m benchmarks.constraints [--quick] [--json PATH]

Over 400 lines on purpose: a benchmark is one runnable file (``python -m benchmarks.<name>``)
holding its servers, clients and table together.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import write_rows
from runtime.constraints import _engine
from runtime.constraints.catalog import Catalog, TokenizedCatalog
from runtime.constraints.engine import (
    ConstraintEngine,
    compile_byte_catalog,
    compile_catalog,
    compile_plan,
    compile_vocabulary,
)
from runtime.constraints.plan import ConstraintPlan, ItemListPlan
from tests.constraints.reference import ReferenceConstraint, _build_trie

VOCAB = 128_256
EOS, SEP, TERM, PREFIX = 2, 10, 11, 12
FIRST_ITEM_TOKEN = 1000
MAX_ITEMS = 10


@dataclass(frozen=True)
class Workload:
    catalog: TokenizedCatalog
    native: _engine.Catalog
    compile_s: float
    vocabulary: _engine.Vocabulary | None = None


def _vocab_strings() -> list[str]:
    """Token strings for xgrammar: punctuation for the structure, syllable words for items."""
    strings = [f"<ctl{i}>" for i in range(FIRST_ITEM_TOKEN)]
    strings[SEP], strings[TERM], strings[PREFIX], strings[EOS] = ",", "]", "[", "</s>"
    syllables = [c + v for c in "bcdfghjklmnprstvz" for v in "aeiou"]
    words: list[str] = []
    for a in syllables:
        words.append(a)
        for b in syllables:
            words.append(a + b)
            for c in syllables:
                words.append(a + b + c)
                if len(words) >= VOCAB:
                    break
    words = [(" " if i % 2 else "") + w for i, w in enumerate(words)]
    return strings + words[: VOCAB - FIRST_ITEM_TOKEN]


def _catalog(num_items: int, seed: int) -> TokenizedCatalog:
    rng = random.Random(seed)
    # Titles share first tokens the way natural text does: a few thousand common openers.
    openers = [rng.randrange(FIRST_ITEM_TOKEN, VOCAB) for _ in range(3000)]
    seqs: dict[tuple[int, ...], None] = {}
    while len(seqs) < num_items:
        length = rng.randint(2, 7)
        first = openers[min(int(rng.expovariate(1 / 400)), len(openers) - 1)]
        rest = tuple(rng.randrange(FIRST_ITEM_TOKEN, VOCAB) for _ in range(length - 1))
        seqs[(first, *rest)] = None
    ids = tuple(f"i{k}" for k in range(num_items))
    catalog = Catalog("bench", ids, ids, {i: k for k, i in enumerate(ids)})
    return TokenizedCatalog(catalog, tuple(seqs), {}, frozenset())


def _plan(catalog: TokenizedCatalog, allowed: tuple[int, ...] | None) -> ConstraintPlan:
    item_list = ItemListPlan(
        catalog=catalog,
        prefix=(PREFIX,),
        separator=(SEP,),
        terminator=(TERM,),
        min_items=1,
        max_items=MAX_ITEMS,
        unique=True,
        allowed=allowed,
    )
    return ConstraintPlan(VOCAB, EOS, item_list, None, ())


def _trajectory(catalog: TokenizedCatalog, allowed: tuple[int, ...], rng: random.Random):
    items = rng.sample(allowed, rng.randint(1, MAX_ITEMS))
    tokens = [PREFIX]
    for k, item in enumerate(items):
        if k:
            tokens.append(SEP)
        tokens.extend(catalog.tokens[item])
    return [*tokens, TERM, EOS]


@dataclass
class _Requests:
    plans: list[ConstraintPlan]
    paths: list[list[int]]
    positions: list[int]


def _requests(
    catalog: TokenizedCatalog, batch: int, allow: int, seed: int, universe: int | None = None
) -> _Requests:
    rng = random.Random(seed)
    pick = np.random.default_rng(seed)
    n = universe or len(catalog.tokens)
    plans, paths, positions = [], [], []
    for _ in range(batch):
        allowed = tuple(np.sort(pick.choice(n, allow, replace=False)).tolist())
        plans.append(_plan(catalog, allowed))
        path = _trajectory(catalog, allowed, rng)
        paths.append(path)
        positions.append(rng.randrange(len(path) - 1))  # a mix of states at the first step
    return _Requests(plans, paths, positions)


def _copy(reqs: _Requests) -> _Requests:
    return _Requests(reqs.plans, list(reqs.paths), list(reqs.positions))


def _stats(samples: list[float], batch: int) -> dict[str, float]:
    ordered = sorted(samples)
    median = statistics.median(ordered) * 1e6
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1e6
    return {"median_us": median, "p99_us": p99, "per_request_us": median / batch}


def _next_tokens(reqs: _Requests, restart: Callable[[int], None]) -> list[int]:
    """The token each request emits this step; finished requests start over (untimed)."""
    tokens = []
    for i, path in enumerate(reqs.paths):
        if reqs.positions[i] >= len(path):
            reqs.positions[i] = 0
            restart(i)
        tokens.append(path[reqs.positions[i]])
        reqs.positions[i] += 1
    return tokens


def _engine_at_start(w: Workload, reqs: _Requests, threads: int) -> ConstraintEngine:
    """An engine holding every request in slot i, advanced to its starting position."""
    engine = ConstraintEngine(len(reqs.plans), VOCAB, threads)
    for slot, plan in enumerate(reqs.plans):
        engine.add(slot, compile_plan(plan, w.native, w.vocabulary))
        engine.advance(slot, reqs.paths[slot][: reqs.positions[slot]])
    return engine


def bench_engine(w: Workload, reqs: _Requests, threads: int, steps: int) -> dict[str, float]:
    batch = len(reqs.plans)
    engine = _engine_at_start(w, reqs, threads)
    mask = np.zeros((batch, engine.words), dtype=np.int32)
    rows = np.arange(batch, dtype=np.int32)
    samples = []
    for _ in range(steps + 3):
        tokens = np.asarray(_next_tokens(reqs, engine.reset), dtype=np.int32)
        start = time.perf_counter()
        engine.native.advance_batch(rows, tokens)
        engine.fill(mask, rows)
        samples.append(time.perf_counter() - start)
    return _stats(samples[3:], batch)


def bench_mask(w: Workload, reqs: _Requests, threads: int, steps: int) -> dict[str, float]:
    """Masking a batch's float32 logits with each step's bitmask (the step itself untimed)."""
    batch = len(reqs.plans)
    engine = _engine_at_start(w, reqs, threads)
    mask = np.zeros((batch, engine.words), dtype=np.int32)
    rows = np.arange(batch, dtype=np.int32)
    logits = np.random.default_rng(batch).standard_normal((batch, VOCAB), dtype=np.float32)
    samples = []
    for _ in range(steps + 3):
        tokens = np.asarray(_next_tokens(reqs, engine.reset), dtype=np.int32)
        engine.native.advance_batch(rows, tokens)
        engine.fill(mask, rows)
        start = time.perf_counter()
        engine.mask_logits(logits, mask, rows)
        samples.append(time.perf_counter() - start)
    return _stats(samples[3:], batch)


def bench_reference(reqs: _Requests, steps: int) -> dict[str, float]:
    batch = len(reqs.plans)
    refs = [ReferenceConstraint(p) for p in reqs.plans]
    for ref, path, pos in zip(refs, reqs.paths, reqs.positions, strict=True):
        for token in path[:pos]:
            ref.advance(token)
    mask = np.zeros((batch, (VOCAB + 31) // 32), dtype=np.int32)
    samples = []
    for _ in range(steps + 1):
        tokens = _next_tokens(reqs, lambda i: refs[i].reset())
        start = time.perf_counter()
        for i, ref in enumerate(refs):
            ref.advance(tokens[i])
            ref.fill_row(mask[i])
        samples.append(time.perf_counter() - start)
    return _stats(samples[1:], batch)


class _Xgrammar:
    """xgrammar over the first 10,000 catalog items as one EBNF alternation."""

    def __init__(self, catalog: TokenizedCatalog, num_items: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        vocab = _vocab_strings()
        texts = ["".join(vocab[t] for t in catalog.tokens[k]) for k in range(num_items)]
        alternation = " | ".join(json.dumps(t) for t in texts)
        ebnf = f'root ::= "[" item ("," item){{0,{MAX_ITEMS - 1}}} "]"\nitem ::= {alternation}\n'
        info = xgr.TokenizerInfo(vocab, vocab_size=VOCAB, stop_token_ids=[EOS])
        compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        start = time.perf_counter()
        self.compiled = compiler.compile_grammar(ebnf)
        self.compile_s = time.perf_counter() - start
        self.num_tokens = sum(len(catalog.tokens[k]) for k in range(num_items))

    def bench(self, reqs: _Requests, steps: int) -> dict[str, float]:
        xgr = self.xgr
        batch = len(reqs.plans)
        # A matcher that accepted end of sequence refuses to fill: restart at the terminator.
        reqs.paths = [path[:-1] for path in reqs.paths]
        reqs.positions = [
            min(p, len(path) - 1) for p, path in zip(reqs.positions, reqs.paths, strict=True)
        ]
        matchers = [xgr.GrammarMatcher(self.compiled) for _ in range(batch)]
        for matcher, path, pos in zip(matchers, reqs.paths, reqs.positions, strict=True):
            for token in path[:pos]:
                assert matcher.accept_token(token)
        batcher = xgr.BatchGrammarMatcher("auto")
        mask = xgr.allocate_token_bitmask(batch, VOCAB)
        samples = []
        for _ in range(steps + 2):
            tokens = _next_tokens(reqs, lambda i: matchers[i].reset())
            start = time.perf_counter()
            accepted = xgr.BatchGrammarMatcher.batch_accept_token(matchers, tokens)
            batcher.batch_fill_next_token_bitmask(matchers, mask)
            samples.append(time.perf_counter() - start)
            assert all(accepted)
        return _stats(samples[2:], batch)


def _token_bytes() -> tuple[bytes | None, ...]:
    """Byte strings for the synthetic vocabulary: words as text, the 256 single bytes among the
    control ids, punctuation; end of sequence has none (a special token)."""
    table: list[bytes | None] = [s.encode("utf-8") for s in _vocab_strings()]
    for b in range(256):
        table[100 + b] = bytes([b])
    table[EOS] = None
    return tuple(table)


def _decoded_workload(catalog: TokenizedCatalog) -> tuple[Workload, TokenizedCatalog, float]:
    """The catalog with each item's text spelled by its tokens, compiled over bytes."""
    vocab = _vocab_strings()
    texts = tuple("".join(vocab[t] for t in seq) for seq in catalog.tokens)
    ids = catalog.catalog.ids
    text_catalog = Catalog("bench", ids, texts, catalog.catalog.index, matching="decoded")
    decoded = TokenizedCatalog(text_catalog, catalog.tokens, {}, frozenset())
    start = time.perf_counter()
    native = compile_byte_catalog(decoded)
    compile_s = time.perf_counter() - start
    table = _token_bytes()
    start = time.perf_counter()
    vocabulary = compile_vocabulary(table)
    vocab_s = time.perf_counter() - start
    return Workload(decoded, native, compile_s, vocabulary), decoded, vocab_s


def _decoded_requests(reqs: _Requests, catalog: TokenizedCatalog) -> _Requests:
    """The same requests matched on decoded bytes (their token paths spell valid lists)."""
    table = _token_bytes()
    plans = []
    for plan in reqs.plans:
        spec = plan.item_list
        assert spec is not None
        item_list = ItemListPlan(
            catalog=catalog,
            prefix=(),
            separator=(),
            terminator=(),
            min_items=spec.min_items,
            max_items=spec.max_items,
            unique=spec.unique,
            allowed=spec.allowed,
            matching="decoded",
            prefix_bytes=b"[",
            separator_bytes=b",",
            terminator_bytes=b"]",
            token_bytes=table,
        )
        plans.append(ConstraintPlan(VOCAB, EOS, item_list, None, ()))
    return _Requests(plans, list(reqs.paths), list(reqs.positions))


def _python_trie_footprint(catalog: TokenizedCatalog) -> tuple[float, float]:
    spec = _plan(catalog, tuple(range(len(catalog.tokens)))).item_list
    assert spec is not None
    tracemalloc.start()
    start = time.perf_counter()
    trie = _build_trie(spec)
    elapsed = time.perf_counter() - start
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del trie
    return elapsed, size / catalog.num_tokens


def bench_setup(w: Workload, allow: int | None, repeats: int) -> dict[str, Any]:
    """A request's constraint built from its plan (what ``update_state`` does for each new
    request, on the engine's loop): ``allow`` items of the catalog, or every item (None)."""
    rng = random.Random(allow or 0)
    count = len(w.catalog.tokens)
    allowed = None if allow is None else tuple(sorted(rng.sample(range(count), allow)))
    plan = _plan(w.catalog, allowed)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        compile_plan(plan, w.native, w.vocabulary)
        samples.append(time.perf_counter() - start)
    return {
        "impl": "engine_setup",
        "items": count,
        "allow_size": allow,
        "setup_us": statistics.median(samples) * 1e6,
    }


def run(quick: bool) -> list[dict[str, Any]]:
    catalog = _catalog(100_000, seed=7)
    start = time.perf_counter()
    native = compile_catalog(catalog, VOCAB)
    w = Workload(catalog, native, time.perf_counter() - start)
    threads = _engine.default_num_threads()
    batches = [8, 256] if quick else [1, 8, 64, 256, 512]

    # A p99 needs a few thousand samples where steps take microseconds: small batches run more
    # steps (about 20,000 request-steps, 100 at least) so the tail is measured, not sampled.
    def steps_for(batch: int) -> int:
        return 15 if quick else max(100, min(3_000, 20_000 // batch))

    rows: list[dict[str, Any]] = []
    compile_rows: list[dict[str, Any]] = []
    per_token = native.memory_bytes / native.num_tokens
    for impl in ("engine_1_thread", "engine_all_threads"):
        compile_rows.append(
            {"impl": impl, "compile_s": w.compile_s, "bytes_per_token": per_token, "items": 100_000}
        )
    if not quick:  # tracing every allocation of a 100,000-item Python trie takes a while
        ref_s, ref_bytes = _python_trie_footprint(catalog)
        compile_rows.append(
            {
                "impl": "python_reference",
                "compile_s": ref_s,
                "bytes_per_token": ref_bytes,
                "items": 100_000,
            }
        )
    xg = _Xgrammar(catalog, 10_000)
    compile_rows.append(
        {
            "impl": "xgrammar",
            "compile_s": xg.compile_s,
            "bytes_per_token": xg.compiled.memory_size_bytes / xg.num_tokens,
            "items": 10_000,
        }
    )
    decoded_w, decoded_catalog, vocab_s = _decoded_workload(catalog)
    compile_rows.append(
        {
            "impl": "engine_all_threads",
            "mode": "decoded",
            "compile_s": decoded_w.compile_s,
            "bytes_per_token": decoded_w.native.memory_bytes / catalog.num_tokens,
            "items": 100_000,
            "vocab_compile_s": vocab_s,
            "vocab_mb": decoded_w.vocabulary.memory_bytes / 1e6,  # type: ignore[union-attr]
        }
    )
    for allow in (None, 2_000, 50_000):
        compile_rows.append(bench_setup(w, allow, 50 if quick else 500))
    for batch in [64] if quick else [1, 64, 256]:
        reqs = _requests(catalog, batch, 2_000, batch * 7 + 2_000)
        for mode, run_w, run_reqs in (
            ("canonical", w, _copy(reqs)),
            ("decoded", decoded_w, _decoded_requests(reqs, decoded_catalog)),
        ):
            stats = bench_engine(run_w, run_reqs, threads, steps_for(batch))
            rows.append(
                {
                    "impl": "engine_all_threads",
                    "mode": mode,
                    "batch": batch,
                    "allow_size": 2_000,
                    **stats,
                }
            )
    for allow in (2_000, 50_000):
        for batch in batches:
            seed = batch * 7 + allow
            steps = steps_for(batch)
            reqs = _requests(catalog, batch, allow, seed)
            measured: dict[str, Callable[[], dict[str, float]]] = {
                "engine_1_thread": partial(bench_engine, w, _copy(reqs), 1, steps),
                "engine_all_threads": partial(bench_engine, w, _copy(reqs), threads, steps),
            }
            if allow == 2_000:
                measured["engine_mask"] = partial(bench_mask, w, _copy(reqs), threads, steps)
            # The reference builds a Python trie per request: 50,000-item lists only up to 64.
            if allow == 2_000 or batch <= (8 if quick else 64):
                measured["python_reference"] = partial(
                    bench_reference, _copy(reqs), max(3, steps // 10)
                )
            if allow == 2_000:
                measured["xgrammar"] = partial(
                    xg.bench, _requests(catalog, batch, allow, seed, universe=10_000), steps
                )
            for impl, fn in measured.items():
                rows.append({"impl": impl, "batch": batch, "allow_size": allow, **fn()})
    return rows + compile_rows


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"{'impl':<20}{'allow':>8}{'batch':>7}{'median_us':>12}{'p99_us':>12}{'us/request':>12}")
    for r in rows:
        if "batch" in r and "mode" not in r:
            print(
                f"{r['impl']:<20}{r['allow_size']:>8}{r['batch']:>7}{r['median_us']:>12.1f}"
                f"{r['p99_us']:>12.1f}{r['per_request_us']:>12.2f}"
            )
    print(f"\n{'impl':<28}{'items':>8}{'compile_s':>12}{'bytes/token':>13}")
    for r in rows:
        if "compile_s" in r:
            impl = r["impl"] + (" decoded" if r.get("mode") == "decoded" else "")
            print(f"{impl:<28}{r['items']:>8}{r['compile_s']:>12.3f}{r['bytes_per_token']:>13.1f}")
    print(f"\n{'request set-up, items allowed':<32}{'of items':>10}{'median_us':>12}")
    for r in rows:
        if "setup_us" in r:
            allowed = "every item" if r["allow_size"] is None else f"{r['allow_size']:,}"
            print(f"{allowed:<32}{r['items']:>10,}{r['setup_us']:>12.1f}")
    modes = {(r["mode"], r["batch"]): r for r in rows if "mode" in r and "batch" in r}
    if modes:
        print("\nengine_all_threads, allow 2,000: canonical vs decoded matching, side by side")
        print(f"{'batch':>7}{'canonical_us':>14}{'decoded_us':>12}{'decoded_p99':>13}{'ratio':>8}")
        for (mode, batch), r in sorted(modes.items(), key=lambda kv: kv[0][1]):
            if mode != "decoded":
                continue
            base = modes[("canonical", batch)]["median_us"]
            print(
                f"{batch:>7}{base:>14.1f}{r['median_us']:>12.1f}{r['p99_us']:>13.1f}"
                f"{r['median_us'] / base:>8.1f}"
            )
        vocab_rows = [r for r in rows if "vocab_compile_s" in r]
        for r in vocab_rows:
            print(
                f"vocabulary byte trie: compiled in {r['vocab_compile_s']:.3f} s, "
                f"{r['vocab_mb']:.1f} MB"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="B=8 and 256, fewer steps")
    parser.add_argument("--json", type=Path, help="write the rows as a JSON list here")
    args = parser.parse_args(argv)
    rows = run(args.quick)
    _print(rows)
    if args.json:
        write_rows(args.json, rows)


if __name__ == "__main__":
    main()
