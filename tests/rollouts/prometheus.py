"""A real Prometheus (the Debian package) serving recorded series for tests.

Series are written as OpenMetrics text with timestamps, turned into TSDB blocks by
``promtool tsdb create-blocks-from openmetrics``, and served by ``prometheus`` on a free loopback
port. Families are declared ``unknown`` so each series keeps its exact name (OpenMetrics would
otherwise demand a ``_total`` suffix on counters).
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.ports import free_port

Labels = Mapping[str, str]


@dataclass
class Recording:
    """Samples by family name, then by label set: ``{name: {labels: [(ts, value)]}}``."""

    families: dict[str, dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]] = field(
        default_factory=dict
    )

    def add(self, name: str, labels: Labels, samples: list[tuple[float, float]]) -> None:
        key = tuple(sorted(labels.items()))
        self.families.setdefault(name, {}).setdefault(key, []).extend(samples)

    def counter(
        self, name: str, labels: Labels, per_second: float, start: float, end: float, step: float
    ) -> None:
        """A counter growing at ``per_second`` from ``start`` to ``end``, sampled every ``step``."""
        samples, t = [], start
        while t <= end:
            samples.append((t, per_second * (t - start)))
            t += step
        self.add(name, labels, samples)

    def openmetrics(self) -> str:
        lines = []
        for name, series in self.families.items():
            lines.append(f"# TYPE {name} unknown")
            for labels, samples in series.items():
                rendered = ",".join(f'{k}="{v}"' for k, v in labels)
                for ts, value in sorted(samples):
                    lines.append(f"{name}{{{rendered}}} {value} {ts:.3f}")
        lines.append("# EOF")
        return "\n".join(lines) + "\n"


@dataclass
class PrometheusServer:
    """A running Prometheus and a minimal client for its instant-query API."""

    url: str

    def query(self, expr: str, at: float) -> Any:
        response = httpx.get(
            f"{self.url}/api/v1/query", params={"query": expr, "time": at}, timeout=10
        )
        body = response.json()
        assert body["status"] == "success", f"{expr}: {body}"
        return body["data"]

    def vector(self, expr: str, at: float) -> list[float]:
        """The query's result the way Argo's Prometheus provider hands it to successCondition."""
        data = self.query(expr, at)
        if data["resultType"] == "scalar":
            return [float(data["result"][1])]
        return [float(sample["value"][1]) for sample in data["result"]]


@contextmanager
def serve(recording: Recording, workdir: Path) -> Iterator[PrometheusServer]:
    """Backfill ``recording`` into blocks under ``workdir`` and serve them until exit."""
    source, data = workdir / "series.om", workdir / "data"
    source.write_text(recording.openmetrics(), encoding="utf-8")
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n", encoding="utf-8")
    port = free_port()
    process = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            "--storage.tsdb.retention.time=30d",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (workdir / "prometheus.log").read_text()
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "prometheus did not become ready in 30 s"
            time.sleep(0.2)
        yield PrometheusServer(url)
    finally:
        process.terminate()
        process.wait(timeout=20)


def argo_condition(condition: str, result: list[float]) -> bool:
    """Evaluate a successCondition of the form ``result[0] <op> <number>`` as Argo's expr does:
    an empty result is an error, and NaN compares false."""
    import re

    match = re.fullmatch(r"\s*result\[0\]\s*(>=|<=|>|<|==)\s*(-?[0-9.eE+-]+)\s*", condition)
    assert match, f"unsupported successCondition {condition!r}"
    if not result:
        raise IndexError(f"{condition}: the query returned no sample")
    value, op, bound = result[0], match.group(1), float(match.group(2))
    if math.isnan(value):
        return False
    return {
        ">=": value >= bound,
        "<=": value <= bound,
        ">": value > bound,
        "<": value < bound,
        "==": value == bound,
    }[op]
