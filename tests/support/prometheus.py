"""A real Prometheus server (Debian's ``prometheus`` binary) for tests, on a free loopback port.

It scrapes the given targets every second into a temporary TSDB and is stopped on exit.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.ports import free_port

__all__ = ["UPSTREAM_NAMING", "PrometheusServer"]


# Promtool's lint findings about names that vLLM and Triton chose; the proxy must keep them.
UPSTREAM_NAMING = (
    "metric names should not contain ':'",
    'counter metrics should have "_total" suffix',
    "metric names should not contain abbreviated units",
    'non-histogram and non-summary metrics should not have "_count" suffix',
    "metric name should not include type 'histogram'",
    'non-counter metrics should not have "_total" suffix',
)


class PrometheusServer:
    """``prometheus`` scraping ``targets`` (job name -> host:port) every 2 s."""

    def __init__(
        self,
        workdir: Path,
        targets: dict[str, str],
        rule_files: list[Path] = (),  # type: ignore[assignment]
    ) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed: run `make setup` (Debian package)")
        self._binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {
                # The timeout is the whole interval: a scrape that a loaded machine slows past it
                # fails, and marks the target's series stale until the next one.
                "scrape_interval": "2s",
                "scrape_timeout": "2s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in targets.items()
            ],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._process: subprocess.Popen[bytes] | None = None
        self._client = httpx.Client(base_url=self.url, timeout=10)

    def __enter__(self) -> PrometheusServer:
        self._log = open(self.workdir / "prometheus.log", "wb")
        self._process = subprocess.Popen(
            [
                self._binary,
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
                # Hidden flag: the default 5 s wait before the first scrape slows every test.
                "--scrape.discovery-reload-interval=100ms",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log()}")
            try:
                if self._client.get("/-/ready").status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"prometheus not ready within 30 s: {self.log()}")

    def __exit__(self, *exc: object) -> None:
        self._client.close()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()

    def log(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-4000:]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; raises ``AssertionError`` with Prometheus's error if it fails."""
        response = self._client.get("/api/v1/query", params={"query": promql})
        body = response.json()
        assert body.get("status") == "success", f"{promql!r}: {body}"
        return body["data"]["result"]

    def targets_up(self) -> dict[str, bool]:
        """Scrape health per job, from the last scrape."""
        active = self._client.get("/api/v1/targets").json()["data"]["activeTargets"]
        return {t["labels"]["job"]: t["health"] == "up" for t in active}

    def wait_until_scraped(self, timeout_s: float = 30) -> None:
        """Return once every target has been scraped at least once."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            active = self._client.get("/api/v1/targets").json()["data"]["activeTargets"]
            if active and all(t["health"] != "unknown" for t in active):
                return
            time.sleep(0.1)
        raise AssertionError(f"targets not scraped within {timeout_s} s: {self.log()}")

    def wait_for(self, promql: str, predicate: Any, timeout_s: float = 30) -> list[dict[str, Any]]:
        """Poll a query until ``predicate(result)`` holds; return the last result."""
        deadline = time.monotonic() + timeout_s
        result = self.query(promql)
        while not predicate(result) and time.monotonic() < deadline:
            time.sleep(0.2)
            result = self.query(promql)
        return result
