"""Scrape latency, CPU and memory of the metrics proxy, with each reader of vLLM's files.

Volume as in a pod: eight vLLM writer processes (``tests/support/vllm_metrics_writer.py``:
vLLM 0.27.1's families, label sets, buckets and gauge modes, through prometheus_client's
multiprocess mode) and Triton's body for two models (the replay of Triton's exposition,
``tests/support/triton_metrics_server.py``). Two proxies run as separate processes over the
same files: ``python_reader`` (the shipped one, ``runtime.metrics_proxy.multiproc``) and
``collector`` (prometheus_client's ``MultiProcessCollector``, ``tests/metrics_proxy/
collector_reader.py``).
Each runs twice, with ``METRICS_PROXY_REUSE_S`` 0 (no finished merge is served twice;
scrapes that arrive during a merge still share it) and 0.1 (the default). Each is scraped over
loopback HTTP with Prometheus's request headers (OpenMetrics preferred, gzip) by 1 and by 20
concurrent scrapers, each scraping back to back; Triton's replay alone is scraped the same way
for reference. CPU per scrape is the proxy process's CPU time (all threads) over the scrapes.

Targets (issue 23): p99 <= 50 ms with 20 scrapers, CPU <= 20 ms per scrape with one scraper,
peak RSS <= 150 MB. The step rows time one merge's parts in this process (CPU ms).
Run: ``python -m benchmarks.metrics_proxy [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from benchmarks import write_rows
from runtime.metrics_proxy.exposition import encode
from runtime.metrics_proxy.merge import merge_families
from runtime.metrics_proxy.multiproc import MultiprocReader, MultiprocSource
from runtime.metrics_proxy.server import run_from_env
from runtime.metrics_proxy.triton import parse_text_exposition, to_metrics
from tests.metrics_proxy.collector_reader import CollectorReader
from tests.support.metrics_harness import ProxyProcess, WriterProcesses

PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}
MODELS = "llama-3-8b,mistral-7b"
WRITERS = 8
POD = {"LLM_SERVING_MODEL_ID": "llama-3-8b", "LLM_SERVING_MODEL_VERSION": "v7"}
TARGET_P99_MS, TARGET_CPU_MS, TARGET_RSS_MB = 50.0, 20.0, 150.0
READERS: dict[str, Callable[[Path, bool], MultiprocSource]] = {
    "collector": CollectorReader,
    "python_reader": MultiprocReader,
}


def _cpu_s(pid: int) -> float:
    """CPU time of all the process's threads, in ns resolution (``stat`` counts 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _scraper(url: str, count: int, out: list[float], sizes: list[int]) -> None:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        for _ in range(count):
            start = time.perf_counter()
            conn.request("GET", parts.path, headers=PROMETHEUS_HEADERS)
            response = conn.getresponse()
            body = response.read()
            out.append((time.perf_counter() - start) * 1000)
            if response.status != 200:
                raise RuntimeError(f"{url} answered {response.status}")
            sizes.append(len(body))
    finally:
        conn.close()


@dataclass
class _Tally:
    """Scrapes of one endpoint, pooled over the rounds."""

    latencies: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    cpu_ms: float = 0.0


def _measure(url: str, pid: int, concurrency: int, per_scraper: int, tally: _Tally) -> None:
    _scraper(url, 3, [], [])  # warm up: imports, caches, the Triton connection
    cpu_before = _cpu_s(pid)
    threads = [
        threading.Thread(target=_scraper, args=(url, per_scraper, tally.latencies, tally.sizes))
        for _ in range(concurrency)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tally.cpu_ms += (_cpu_s(pid) - cpu_before) * 1000


def _row(impl: str, reuse_ms: int, pid: int, concurrency: int, tally: _Tally) -> dict[str, Any]:
    latencies = sorted(tally.latencies)
    scrapes = len(latencies)
    return {
        "impl": impl,
        "reuse_ms": reuse_ms,
        "concurrency": concurrency,
        "scrapes": scrapes,
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(latencies[min(scrapes - 1, int(scrapes * 0.99))], 2),
        "cpu_ms_per_scrape": round(tally.cpu_ms / scrapes, 2),
        "peak_rss_mb": round(_peak_rss_mb(pid), 1),
        "body_kb": round(statistics.median(tally.sizes) / 1024, 1),
    }


def _steps(multiproc: Path, triton_url: str, repeats: int) -> list[dict[str, Any]]:
    """CPU ms of each part of one merge, per reader, in this process."""
    text = httpx.get(triton_url, timeout=10).text
    labels = (("model_id", "llama-3-8b"), ("model_version", "v7"))
    rows = []
    for impl, factory in READERS.items():
        reader = factory(multiproc, False)
        families = reader.read().families
        triton = to_metrics(parse_text_exposition(text))
        merged, _ = merge_families([(families, True), (triton, False)], labels)
        steps: dict[str, Callable[[], object]] = {
            "read_db": reader.read,
            "parse_triton": lambda: to_metrics(parse_text_exposition(text)),
            "merge": lambda f=families, t=triton: merge_families([(f, True), (t, False)], labels),  # type: ignore[misc]
            "encode_openmetrics": lambda m=merged: encode(m, True),  # type: ignore[misc]
        }
        row: dict[str, Any] = {"impl": f"steps_{impl}"}
        for name, step in steps.items():
            step()
            start = time.process_time()
            for _ in range(repeats):
                step()
            row[f"{name}_cpu_ms"] = round((time.process_time() - start) * 1000 / repeats, 2)
        rows.append(row)
    return rows


def run(quick: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Start the writers, Triton's replay and both proxies; scrape them round by round."""
    # (concurrency, scrapes per scraper per round, rounds): the endpoints take turns round
    # by round, so that the noise of a shared machine hits them alike.
    plan = [(1, 25, 2 if quick else 8), (20, 5, 2 if quick else 8)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        multiproc = Path(tmp)
        with WriterProcesses(multiproc, WRITERS) as writers:
            for _ in range(3):
                writers.tick()
        triton = subprocess.Popen(
            [sys.executable, "-m", "tests.support.triton_metrics_server", "--models", MODELS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        try:
            assert triton.stdout is not None
            triton_url = triton.stdout.readline().strip()
            with contextlib.ExitStack() as stack:
                # (impl, reuse_ms, url, pid); reuse 0: every scrape merges (or joins the merge
                # in flight); 100 ms: the default, which serves a merge that recent again.
                endpoints: list[tuple[str, int, str, int]] = [
                    ("triton_alone", 0, triton_url, triton.pid)
                ]
                for reuse_ms in (0, 100):
                    for impl in READERS:
                        proxy = stack.enter_context(
                            ProxyProcess(
                                multiproc,
                                triton_url,
                                ("-m", "benchmarks.metrics_proxy", "--serve", impl),
                                **POD,
                                METRICS_PROXY_REUSE_S=str(reuse_ms / 1000),
                            )
                        )
                        assert proxy.process is not None
                        endpoints.append(
                            (impl, reuse_ms, f"{proxy.url}/metrics", proxy.process.pid)
                        )
                for concurrency, per_scraper, rounds in plan:
                    tallies = [_Tally() for _ in endpoints]
                    for _ in range(rounds):
                        for (_, _, url, pid), tally in zip(endpoints, tallies, strict=True):
                            _measure(url, pid, concurrency, per_scraper, tally)
                    for (impl, reuse_ms, _, pid), tally in zip(endpoints, tallies, strict=True):
                        rows.append(_row(impl, reuse_ms, pid, concurrency, tally))
            steps = _steps(multiproc, triton_url, 10 if quick else 50)
        finally:
            if triton.stdin is not None:
                triton.stdin.close()
            triton.wait(timeout=10)
    return rows, steps


def _table(rows: list[dict[str, Any]]) -> None:
    columns = list(rows[0])
    print("  ".join(f"{c:>18}" for c in columns))
    for row in rows:
        print("  ".join(f"{row[c]!s:>18}" for c in columns))


def _verdict(rows: list[dict[str, Any]]) -> None:
    """The targets, per reader: CPU from the rows that merge on every scrape (reuse 0)."""
    by = {(r["impl"], r["reuse_ms"], r["concurrency"]): r for r in rows}
    for impl in READERS:
        p99 = by[(impl, 0, 20)]["p99_ms"]
        p99_reuse = by[(impl, 100, 20)]["p99_ms"]
        cpu = by[(impl, 0, 1)]["cpu_ms_per_scrape"]
        rss = max(r["peak_rss_mb"] for r in rows if r["impl"] == impl)
        checks = [
            f"p99 at 20 scrapers {p99} ms, {p99_reuse} ms with the 100 ms reuse "
            f"(<= {TARGET_P99_MS:g}: {p99 <= TARGET_P99_MS}, {p99_reuse <= TARGET_P99_MS})",
            f"CPU per scrape {cpu} ms (<= {TARGET_CPU_MS:g}: {cpu <= TARGET_CPU_MS})",
            f"peak RSS {rss} MB (<= {TARGET_RSS_MB:g}: {rss <= TARGET_RSS_MB})",
        ]
        print(f"{impl}: " + "; ".join(checks))


def main() -> None:
    """Parse options, run, print the tables, write JSON rows if asked."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer scrapes (under a minute)")
    parser.add_argument("--json", type=Path, help="write the rows as a JSON list here")
    parser.add_argument("--serve", choices=sorted(READERS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:  # one of the proxies under test, configured by the environment
        sys.exit(run_from_env(READERS[args.serve]))
    rows, steps = run(args.quick)
    _table(rows)
    print()
    _table(steps)
    print()
    _verdict(rows)
    if args.json:
        write_rows(args.json, rows + steps)


if __name__ == "__main__":
    main()
