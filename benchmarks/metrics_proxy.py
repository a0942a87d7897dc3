"""Scrape latency, CPU and memory of the metrics proxy beside Triton's endpoint alone.

Realistic volume: Triton's families for 2 models (served by the test replay of Triton's
exposition, ``tests/support/triton_metrics_server.py``), vLLM's 46 families written by 8
processes with vLLM's buckets. Both servers run as separate processes and are scraped over
loopback HTTP with Prometheus's request headers (OpenMetrics preferred, gzip) by 1 and 20
concurrent scrapers, each scraping back to back. ``reuse_ms`` 0 rows merge on every scrape;
100 ms rows (the default) share a merge among scrapes that come together, which back-to-back
scrapers always do, so those rows show the cost of serving a cached merge. The files do not
change during the run, which flatters nothing: the proxy re-reads and re-sums every value on
every merge (only names, labels and file layouts are cached). The figure the target is about:
added time = proxy p50 - triton_alone p50 (same run, same concurrency), printed as a multiple
of triton_alone p50 (target <= 2x, merging every scrape). A third proxy (``writers`` 0) reads
an empty multiprocess directory: its added time is the proxy's fixed cost per scrape (HTTP
serving, Triton's fetch, parse and body), which no faster merge can remove.
Run: ``python -m benchmarks.metrics_proxy [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from runtime.metrics_proxy import _metrics
from runtime.metrics_proxy.multiproc import MultiprocReader
from tests.support.metrics_harness import ProxyProcess, WriterProcesses

PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}
MODELS = "llama-3-8b,mistral-7b"
WRITERS = 8


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


def _scraper(
    url: str, count: int, out: list[float], sizes: list[int], conns: list | None = None
) -> None:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    for _ in range(count):
        start = time.perf_counter()
        conn.request("GET", parts.path, headers=PROMETHEUS_HEADERS)
        response = conn.getresponse()
        body = response.read()
        out.append((time.perf_counter() - start) * 1000)
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}")
        sizes.append(len(body))
    if conns is None:
        conn.close()
    else:
        conns.append(conn)  # closed after the CPU reading: a server thread per connection


@dataclass
class _Tally:
    """Scrapes of one endpoint, pooled over the rounds."""

    latencies: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    cpu_ms: float = 0.0


def _measure(url: str, pid: int, concurrency: int, per_scraper: int, tally: _Tally) -> None:
    _scraper(url, 3, [], [])  # warm up connection pools and caches
    time.sleep(0.2)  # let the server end the warm-up connection's thread before counting
    conns: list[http.client.HTTPConnection] = []
    cpu_before = _cpu_s(pid)
    threads = [
        threading.Thread(
            target=_scraper, args=(url, per_scraper, tally.latencies, tally.sizes, conns)
        )
        for _ in range(concurrency)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tally.cpu_ms += (_cpu_s(pid) - cpu_before) * 1000
    for conn in conns:
        conn.close()


def _row(impl: str, pid: int, concurrency: int, tally: _Tally) -> dict:
    latencies = sorted(tally.latencies)
    scrapes = len(latencies)
    return {
        "impl": impl,
        "concurrency": concurrency,
        "scrapes": scrapes,
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(latencies[min(scrapes - 1, int(scrapes * 0.99))], 3),
        "cpu_ms_per_scrape": round(tally.cpu_ms / scrapes, 3),
        "peak_rss_mb": round(_peak_rss_mb(pid), 1),
        "body_kb": round(statistics.median(tally.sizes) / 1024, 1),
    }


def _breakdown(multiproc: Path, triton_url: str, repeats: int) -> dict[str, float]:
    """Milliseconds per step of one merge as the proxy runs it (natively), in this process."""
    reader = _metrics.MultiprocReader(str(multiproc))
    body = httpx.get(triton_url, timeout=10).content
    parser = _metrics.TextParser()
    encoder = _metrics.Encoder([("model_id", "llama-3-8b"), ("colour", "blue")])
    vllm, triton = reader.read(), parser.parse(body)

    def write(gzipped: bool) -> bytes:
        writer = _metrics.BodyWriter(encoder, True, gzipped)
        writer.add(vllm)
        writer.add(triton)
        return writer.finish()

    steps = {
        "read_db": reader.read,
        "parse_triton": lambda: parser.parse(body),
        "write": lambda: write(False),
        "write_gzip": lambda: write(True),
    }
    out = {}
    for name, step in steps.items():
        step()
        start = time.process_time()
        for _ in range(repeats):
            step()
        out[name] = (time.process_time() - start) * 1000 / repeats
    return out


def _merge_alone(multiproc: Path, repeats: int) -> list[float]:
    """Milliseconds to merge the .db files: the proxy's native reader, the Python reference
    reader, and prometheus_client's collector."""
    native = _metrics.MultiprocReader(str(multiproc))
    python = MultiprocReader(multiproc)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(multiproc))
    timings = []
    for merge in (native.read, python.read, lambda: list(registry.collect())):
        merge()
        start = time.perf_counter()
        for _ in range(repeats):
            merge()
        timings.append((time.perf_counter() - start) * 1000 / repeats)
    return timings


def run(quick: bool) -> list[dict]:
    """Start the writers, Triton's replay and the proxy; scrape both endpoints side by side."""
    # (concurrency, scrapes per scraper per round, rounds): the endpoints take turns round
    # by round, so that the noise of a shared machine hits them alike.
    plan = [(1, 50, 4 if quick else 20), (20, 5, 2 if quick else 20)]
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp,
        tempfile.TemporaryDirectory(prefix="bench-metrics-empty-") as empty,
    ):
        multiproc = Path(tmp)
        with WriterProcesses(multiproc, WRITERS) as writers:
            for _ in range(3):
                writers.tick()
        native, python, upstream = _merge_alone(multiproc, 20 if quick else 100)
        print(
            f"merging {WRITERS} processes' files alone: proxy (native) {native:.2f} ms, "
            f"Python reference reader {python:.2f} ms, "
            f"prometheus_client MultiProcessCollector {upstream:.2f} ms"
        )
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
            pod = {"LLM_SERVING_MODEL_ID": "llama-3-8b", "LLM_SERVING_COLOUR": "blue"}
            # reuse 0: every scrape merges (the worst case); 100 ms: the default, where
            # scrapes arriving together share one merge.
            with (
                ProxyProcess(multiproc, triton_url, METRICS_PROXY_REUSE_S="0", **pod) as merge,
                ProxyProcess(multiproc, triton_url, METRICS_PROXY_REUSE_S="0.1", **pod) as reuse,
                ProxyProcess(Path(empty), triton_url, METRICS_PROXY_REUSE_S="0", **pod) as fixed,
            ):
                assert merge.process and reuse.process and fixed.process
                # (impl, reuse_ms, writers, url, pid)
                endpoints = [
                    ("triton_alone", 0, 0, triton_url, triton.pid),
                    ("proxy", 0, WRITERS, f"{merge.url}/metrics", merge.process.pid),
                    ("proxy", 100, WRITERS, f"{reuse.url}/metrics", reuse.process.pid),
                    ("proxy", 0, 0, f"{fixed.url}/metrics", fixed.process.pid),
                ]
                for concurrency, per_scraper, rounds in plan:
                    tallies = [_Tally() for _ in endpoints]
                    for _ in range(rounds):
                        for (*_, url, pid), tally in zip(endpoints, tallies, strict=True):
                            _measure(url, pid, concurrency, per_scraper, tally)
                    for (impl, reuse_ms, n_writers, _, pid), tally in zip(
                        endpoints, tallies, strict=True
                    ):
                        row = _row(impl, pid, concurrency, tally)
                        rows.append({**row, "reuse_ms": reuse_ms, "writers": n_writers})
                steps = _breakdown(multiproc, triton_url, 50 if quick else 300)
                print(
                    "one merge, step by step (native, CPU ms, in this process; write_gzip is "
                    "write with gzip): "
                    + ", ".join(f"{name} {ms:.3f}" for name, ms in steps.items())
                )
        finally:
            if triton.stdin is not None:
                triton.stdin.close()
            triton.wait(timeout=10)
    return rows


def _print(rows: list[dict]) -> None:
    columns = list(rows[0])
    print("  ".join(f"{c:>17}" for c in columns))
    for row in rows:
        print("  ".join(f"{row[c]!s:>17}" for c in columns))
    by = {(r["impl"], r["concurrency"], r["reuse_ms"], r["writers"]): r for r in rows}
    cases = (
        (0, WRITERS, "merging every scrape"),
        (100, WRITERS, "100 ms reuse window"),
        (0, 0, "fixed cost (no .db files)"),
    )
    for concurrency in sorted({r["concurrency"] for r in rows}):
        alone = by[("triton_alone", concurrency, 0, 0)]
        for reuse_ms, writers, what in cases:
            proxy = by[("proxy", concurrency, reuse_ms, writers)]
            added = proxy["p50_ms"] - alone["p50_ms"]
            print(
                f"concurrency {concurrency}, {what}: added p50 {added:.3f} ms = "
                f"{added / alone['p50_ms']:.2f}x triton_alone p50 ({alone['p50_ms']:.3f} ms); "
                f"proxy/triton_alone p50 {proxy['p50_ms'] / alone['p50_ms']:.2f}x, "
                f"p99 {proxy['p99_ms'] / alone['p99_ms']:.2f}x"
            )


def main() -> None:
    """Parse options, run, print the table, write JSON rows if asked."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer scrapes (under a minute)")
    parser.add_argument("--json", type=Path, help="write the rows as a JSON list here")
    args = parser.parse_args()
    rows = run(args.quick)
    _print(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
