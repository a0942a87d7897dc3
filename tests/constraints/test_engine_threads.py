"""One native engine shared by several Python threads (the bindings release the GIL), and an
engine whose worker threads cannot all be started."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from runtime.constraints import _engine
from runtime.constraints.engine import ConstraintEngine

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 600
THREADS = 4
SLOTS_PER_THREAD = 8
STEPS = 150
FILLS_PER_STEP = 20
HAMMER_FILLS = 5000


def _catalog() -> _engine.Catalog:
    rng = random.Random(5)
    seqs = sorted(
        {tuple(rng.randrange(1, 300) for _ in range(rng.randint(1, 4))) for _ in range(400)}
    )
    offsets = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    tokens = np.asarray([t for s in seqs for t in s], np.int32)
    return _engine.Catalog(tokens, offsets, VOCAB)


def _constraint(catalog: _engine.Catalog, rng: random.Random) -> _engine.Constraint:
    allowed = np.asarray(sorted(rng.sample(range(catalog.num_items), 40)), np.int32)
    return _engine.Constraint.item_list(
        catalog, [], [500], [501], 1, 4, rng.random() < 0.5, allowed, 0, [], VOCAB
    )


Engine = ConstraintEngine | _engine.Engine


def _script(engine: Engine, catalog: _engine.Catalog, owner: int) -> list[np.ndarray]:
    """Drive the owner's slots (add, fill with and without waiting, advance, reset) and return
    the rows of every fill."""
    rng = random.Random(owner)
    slots = list(range(owner * SLOTS_PER_THREAD, (owner + 1) * SLOTS_PER_THREAD))
    rows = np.asarray(slots, np.int32)
    mask = np.zeros((engine.max_batch, engine.words), np.int32)
    for slot in slots:
        engine.add(slot, _constraint(catalog, rng))
    seen = []
    for _ in range(STEPS):
        # Repeated fills of the same states: the same rows, and many native calls to overlap.
        for _ in range(FILLS_PER_STEP):
            engine.fill(mask, rows, wait=rng.random() < 0.5)
            engine.wait()
        seen.append(mask[rows].copy())
        tokens = []
        for slot in slots:
            bits = np.flatnonzero(np.unpackbits(mask[slot].view(np.uint8), bitorder="little"))
            tokens.append(int(bits[rng.randrange(len(bits))]))
        engine.advance_batch(rows, np.asarray(tokens, np.int32))
        op = rng.random()
        slot = rng.choice(slots)
        if op < 0.1:
            engine.reset(slot)
        elif op < 0.2 or engine.slot_info(slot)["finished"]:
            engine.add(slot, _constraint(catalog, rng))
        assert engine.active(slot)
    return seen


def _run_threads(target: Callable[[int], None]) -> list[str]:
    """Run ``target(owner)`` on THREADS threads at once; the errors they raised."""
    errors: list[str] = []

    def run(owner: int) -> None:
        try:
            target(owner)
        except Exception as exc:  # reported by the caller, with the thread that raised it
            errors.append(f"thread {owner}: {exc!r}")

    # Daemon threads: a deadlock fails the test at its timeout instead of hanging the run.
    workers = [threading.Thread(target=run, args=(owner,), daemon=True) for owner in range(THREADS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return errors


@pytest.mark.timeout(120)  # without the engine's lock the threads can deadlock
@pytest.mark.parametrize("kind", [_engine.Engine, ConstraintEngine])
def test_threads_filling_the_same_rows_get_the_one_thread_masks(kind: type[Engine]) -> None:
    catalog = _catalog()
    rng = random.Random(11)
    engine = kind(64, VOCAB, 2)
    for slot in range(64):
        engine.add(slot, _constraint(catalog, rng))
    rows = np.arange(64, dtype=np.int32)
    expected = np.zeros((64, engine.words), np.int32)
    engine.fill(expected, rows)
    wrong: list[str] = []

    def fill(owner: int) -> None:
        mask = np.zeros_like(expected)
        choose = random.Random(owner)
        for i in range(HAMMER_FILLS):
            mask[:] = 0
            engine.fill(mask, rows, wait=choose.random() < 0.5)
            engine.wait()
            if not np.array_equal(mask, expected):
                wrong.append(f"thread {owner}, fill {i}")
                return

    assert _run_threads(fill) == []
    assert wrong == []


@pytest.mark.timeout(120)  # without the engine's lock the threads can deadlock
@pytest.mark.parametrize("kind", [_engine.Engine, ConstraintEngine])
def test_threads_sharing_one_engine_get_the_one_thread_results(kind: type[Engine]) -> None:
    # The native engine itself, and its Python face.
    catalog = _catalog()
    expected = [
        _script(kind(THREADS * SLOTS_PER_THREAD, VOCAB, 2), catalog, owner)
        for owner in range(THREADS)
    ]
    shared = kind(THREADS * SLOTS_PER_THREAD, VOCAB, 2)
    results: dict[int, list[np.ndarray]] = {}

    def run(owner: int) -> None:
        results[owner] = _script(shared, catalog, owner)

    assert _run_threads(run) == []
    for owner in range(THREADS):
        for step, (got, want) in enumerate(zip(results[owner], expected[owner], strict=True)):
            assert (got == want).all(), f"thread {owner}, step {step}"


def test_pending_fill_keeps_its_bitmask_until_waited_for() -> None:
    # A thread that drops its bitmask (or ends) after fill(wait=False) must not leave the
    # workers writing freed memory; the engine holds the buffer until a wait, from any thread.
    engine = _engine.Engine(64, VOCAB, 2)
    for slot in range(64):
        engine.add(slot, _engine.Constraint.banned(0, [slot + 1], VOCAB))
    refs = []

    def start(owner: int) -> None:
        mask = np.zeros((64, engine.words), np.int32)
        refs.append(weakref.ref(mask))
        engine.fill(mask, np.arange(64, dtype=np.int32), wait=False)

    worker = threading.Thread(target=start, args=(0,))
    worker.start()
    worker.join()
    assert refs[0]() is not None
    engine.wait()
    assert refs[0]() is None


def test_failed_worker_start_raises_and_leaves_no_thread() -> None:
    # 2,000 threads' stacks cannot fit in a 3 GiB address space, so thread creation fails part
    # way; the engine must raise, with the started workers joined, and work again afterwards.
    code = textwrap.dedent(
        """
        import resource
        import numpy as np
        from runtime.constraints import _engine
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        try:
            _engine.Engine(1, 40, 2000)
        except RuntimeError as exc:
            print("raised:", exc)
        engine = _engine.Engine(1, 40, 2)
        engine.add(0, _engine.Constraint.banned(0, [3], 40))
        mask = np.zeros((1, engine.words), np.int32)
        engine.fill(mask, np.asarray([0], np.int32))
        print("filled:", mask.tolist())
        """
    )
    # A sanitizer's preload reserves more address space than the limit allows.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "raised: could not start worker thread" in done.stdout, done.stdout
    assert "lower num_threads or LLM_SERVING_ENGINE_THREADS" in done.stdout
    assert "filled: [[-9, 255]]" in done.stdout, done.stdout
