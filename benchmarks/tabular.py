"""Requests per second and p99 latency of a 500-tree XGBoost model over KServe gRPC, with and
without dynamic batching, against calling the library's predict in-process.

The model (500 trees of depth 6 over 16 features, trained at start on generated data) is served
twice by the KServe stand-in run as ``tritonserver`` in a subprocess
(``tests.support.kserve_server``, executing it with the xgboost package:
:mod:`tests.support.repository_models`): ``grpc`` without ``dynamic_batching`` (each request
executes alone) and ``grpc_batched`` with it (``max_batch_size`` 64, no queue delay: whatever
queued while the previous batch ran forms the next). ``in_process`` calls
``Booster.inplace_predict`` on one row from 1 or 64 threads. Every request is one row, sent by
concurrency 1 and 64 clients back to back over one tritonclient asyncio channel.

Real Triton's FIL backend cannot run here (the pip tritonserver has only the Python backend), so
the gRPC/in-process ratio is a diagnostic of the stand-in (a Python gRPC server on two cores
shared with the client), not of Triton; the batching gain is the comparable figure.

    python -m benchmarks.tabular [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as syncclient
import tritonclient.grpc.aio as grpcclient
import xgboost

from benchmarks import write_rows
from tests.support.ports import free_port
from tests.support.repository_models import read_config
from tests.support.tabular_models import Batching, features, write_config, xgboost_model

__all__ = ["main"]

TREES, DEPTH, COLUMNS = 500, 6, 16
CONCURRENCY = (1, 64)
ROOT = Path(__file__).resolve().parents[1]


def _repository(directory: Path) -> xgboost.Booster:
    """Write ``xgb`` and ``xgb_batched`` (the same booster) into ``directory``."""
    booster = xgboost_model(
        directory, "xgb", trees=TREES, depth=DEPTH, columns=COLUMNS, batching=Batching(64)
    )
    shutil.copytree(directory / "xgb", directory / "xgb_batched")
    config = read_config(directory / "xgb_batched")
    config.name = "xgb_batched"
    config.dynamic_batching.SetInParent()
    write_config(directory, config)
    return booster


@contextlib.contextmanager
def _server(repository: Path) -> Iterator[str]:
    """The stand-in serving ``repository`` in its own process; yields its gRPC address."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.kserve_server",
            f"--model-repository={repository}",
            f"--grpc-port={port}",
            "--allow-http=false",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    url = f"127.0.0.1:{port}"
    try:
        client = syncclient.InferenceServerClient(url)
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(Exception):
                if client.is_server_ready():
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the stand-in did not start (exit {proc.poll()})")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def _row(impl: str, concurrency: int, latencies: list[float], elapsed: float) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {
        "impl": impl,
        "concurrency": concurrency,
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(ordered) * 1e3, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3, 3),
    }


def _in_process(booster: xgboost.Booster, rows: np.ndarray, concurrency: int, per: int) -> dict:
    latencies: list[float] = []

    def worker(offset: int) -> None:
        for i in range(per):
            row = rows[(offset + i) % len(rows)][None, :]
            start = time.perf_counter()
            booster.inplace_predict(row)
            latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=worker, args=(w * per,)) for w in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _row("in_process", concurrency, latencies, time.perf_counter() - start)


async def _grpc(url: str, model: str, rows: np.ndarray, concurrency: int, per: int) -> dict:
    client = grpcclient.InferenceServerClient(url)
    latencies: list[float] = []

    async def worker(offset: int) -> None:
        for i in range(per):
            tensor = grpcclient.InferInput("input__0", [1, COLUMNS], "FP32")
            tensor.set_data_from_numpy(rows[(offset + i) % len(rows)][None, :])
            start = time.perf_counter()
            await client.infer(model, [tensor])
            latencies.append(time.perf_counter() - start)

    try:
        await worker(0)  # warm up: the channel, the server's workers, the booster's caches
        latencies.clear()
        start = time.perf_counter()
        await asyncio.gather(*(worker(w * per) for w in range(concurrency)))
        elapsed = time.perf_counter() - start
    finally:
        await client.close()
    impl = "grpc_batched" if model == "xgb_batched" else "grpc"
    return _row(impl, concurrency, latencies, elapsed)


def run(quick: bool) -> list[dict[str, Any]]:
    """Every configuration, gRPC ones against one stand-in process."""
    rows = features(4096, seed=7, columns=COLUMNS)
    with tempfile.TemporaryDirectory() as tmp:
        booster = _repository(Path(tmp))
        per = {1: 200 if quick else 2000, 64: 10 if quick else 60}
        results = [_in_process(booster, rows, c, per[c] * 4) for c in CONCURRENCY]
        with _server(Path(tmp)) as url:
            for c in CONCURRENCY:
                for model in ("xgb", "xgb_batched"):
                    results.append(asyncio.run(_grpc(url, model, rows, c, per[c])))
    return results


def _print(rows: list[dict[str, Any]]) -> None:
    head = f"{'impl':<14} {'conc':>4} {'requests':>8} {'req/s':>10} {'p50_ms':>9} {'p99_ms':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['impl']:<14} {r['concurrency']:>4} {r['requests']:>8} "
            f"{r['requests_per_s']:>10.1f} {r['p50_ms']:>9.3f} {r['p99_ms']:>9.3f}"
        )
    by = {(r["impl"], r["concurrency"]): r["requests_per_s"] for r in rows}
    for c in CONCURRENCY:
        gain = by[("grpc_batched", c)] / by[("grpc", c)]
        share = by[("grpc_batched", c)] / by[("in_process", c)]
        print(
            f"concurrency {c}: dynamic batching gain {gain:.2f}x; batched gRPC reaches "
            f"{share:.1%} of in-process requests/s"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (under a minute)")
    parser.add_argument("--json", type=Path, help="write the rows as JSON to this path")
    args = parser.parse_args(argv)
    rows = run(args.quick)
    _print(rows)
    if args.json is not None:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
