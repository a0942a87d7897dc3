"""One scrape's work: Triton's fetch and the ``.db`` merge side by side, then one body per format.

Scrapes that arrive while a merge runs share it; a finished merge younger than ``reuse_s`` is
served again. A scrape's budget (the timeout Prometheus sent) cuts the merge's wait for Triton;
the scrapes sharing a merge share the earliest of their deadlines. Each source's health and the
proxy's own families are kept here.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from runtime.metrics_proxy.budget import ScrapeBudget
from runtime.metrics_proxy.exposition import encode
from runtime.metrics_proxy.merge import merge_families
from runtime.metrics_proxy.multiproc import MultiprocResult, MultiprocSource
from runtime.metrics_proxy.triton import (
    SeriesCache,
    TritonClient,
    TritonScrapeError,
    parse_text_exposition,
    to_metrics,
)

__all__ = ["Body", "Scraper", "SourceError", "SourceHealth"]

log = logging.getLogger(__name__)

# Error counter label values per source, exposed at 0 from the start so rate() works.
TRITON_REASONS = ("connect", "timeout", "http_status", "too_large", "parse", "internal")
VLLM_REASONS = ("read_dir", "corrupt_file", "internal")
# gzip level 6 (zlib's default): a ~10x smaller body for a few ms of one core.
_GZIP_LEVEL = 6


class SourceError(Exception):
    """vLLM's files could not be read; ``reason`` is the error counter's label value."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class _Source:
    name: str
    reasons: tuple[str, ...]
    up: bool = False
    seconds: float = 0.0
    last_error: str = ""
    errors: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.errors = dict.fromkeys(self.reasons, 0.0)


class SourceHealth:
    """Each source's health across scrapes; logs a failure once per change of message."""

    def __init__(self) -> None:
        self.triton = _Source("triton", TRITON_REASONS)
        self.vllm = _Source("vllm", VLLM_REASONS)
        self.files = 0
        self.corrupt: tuple[str, ...] = ()
        self.duplicates = 0

    def ok(self, source: _Source, seconds: float) -> None:
        source.up, source.last_error, source.seconds = True, "", seconds

    def fail(self, source: _Source, reason: str, message: str, seconds: float) -> None:
        # A reason of no counter's is a bug: counted as internal, never lost.
        source.errors[reason if reason in source.errors else "internal"] += 1
        if source.up or message != source.last_error:
            log.warning("metrics source %s failed (%s): %s", source.name, reason, message)
        source.up, source.last_error, source.seconds = False, message, seconds

    def read_files(self, result: MultiprocResult) -> None:
        self.files = result.files
        self.vllm.errors["corrupt_file"] += len(result.corrupt_files)
        if result.corrupt_files != self.corrupt and result.corrupt_files:
            log.warning("skipping corrupt files: %s", "; ".join(result.corrupt_files))
        self.corrupt = result.corrupt_files

    def families(self) -> list[Metric]:
        """The proxy's own families, reserved: any source's of the same name is hidden."""
        sources = (self.triton, self.vllm)
        up = GaugeMetricFamily(
            "metrics_proxy_source_up",
            "1 if the source was read in the last scrape, 0 if not.",
            labels=["source"],
        )
        seconds = GaugeMetricFamily(
            "metrics_proxy_source_scrape_duration_seconds",
            "Time the last scrape spent reading the source.",
            labels=["source"],
        )
        for s in sources:
            up.add_metric([s.name], 1.0 if s.up else 0.0)
            seconds.add_metric([s.name], s.seconds)
        errors = Metric(
            "metrics_proxy_source_errors",
            "Failed reads of a source (corrupt_file: per skipped file), by reason.",
            "counter",
        )
        errors.samples = [
            Sample("metrics_proxy_source_errors_total", {"source": s.name, "reason": r}, n)
            for s in sources
            for r, n in s.errors.items()
        ]
        return [
            up,
            seconds,
            errors,
            GaugeMetricFamily(
                "metrics_proxy_multiproc_files",
                "Multiprocess .db files merged in the last scrape.",
                value=self.files,
            ),
            GaugeMetricFamily(
                "metrics_proxy_multiproc_corrupt_files",
                "Multiprocess .db files skipped as truncated or corrupt in the last scrape.",
                value=len(self.corrupt),
            ),
            GaugeMetricFamily(
                "metrics_proxy_duplicate_families",
                "Triton families hidden because vLLM's multiprocess files carry them complete.",
                value=self.duplicates,
            ),
        ]


_OWN_NAMES = frozenset(f.name for f in SourceHealth().families())


class Body:
    """One merge's families, encoded once per format on first request."""

    def __init__(self, families: list[Metric], at: float) -> None:
        self.families = families
        self.at = at
        self._bodies: dict[tuple[bool, bool], bytes] = {}

    def encoded(self, openmetrics: bool, gzipped: bool) -> bytes:
        """The body in one format; two scrapes asking at once may both encode it, harmlessly."""
        key = (openmetrics, gzipped)
        body = self._bodies.get(key)
        if body is None:
            body = encode(self.families, openmetrics)
            if gzipped:
                body = gzip.compress(body, compresslevel=_GZIP_LEVEL, mtime=0)
            self._bodies[key] = body
        return body


class Scraper:
    """Merges Triton's metrics and vLLM's files for the scrapes, sharing merges among them."""

    def __init__(
        self,
        triton: TritonClient,
        files: MultiprocSource,
        directory: Path,
        constant_labels: tuple[tuple[str, str], ...],
        reuse_s: float,
    ) -> None:
        self.health = SourceHealth()
        self._triton = triton
        self._files = files
        self._directory = directory
        self._constant = constant_labels
        self._reuse_s = reuse_s
        self._series_cache: SeriesCache = {}
        self._last: Body | None = None
        self._running: asyncio.Task[Body] | None = None
        # The running merge's deadline for Triton (event-loop time), the earliest its scrapes
        # asked for, with the budget that set it; and the timeout holding it while Triton's
        # fetch is under way, which a scrape joining the merge moves earlier.
        self._deadline: float | None = None
        self._deadline_budget: ScrapeBudget | None = None
        self._cut: asyncio.Timeout | None = None

    async def body(self, budget: ScrapeBudget | None = None) -> Body:
        """A merge for this scrape: a recent one, the one running, or a new one.

        With a ``budget``, the merge stops waiting for Triton ``budget.wait_s`` from now (its
        source then fails with ``reason="timeout"``), unless a scrape sharing it set an earlier
        deadline. Triton's configured timeout bounds the wait either way.
        """
        last = self._last
        if last is not None and time.monotonic() - last.at <= self._reuse_s:
            return last
        if self._running is None:
            self._deadline = self._deadline_budget = None
            self._running = asyncio.ensure_future(self._merge())
            self._running.add_done_callback(self._finished)
        if budget is not None:
            self._bound(asyncio.get_running_loop().time() + budget.wait_s, budget)
        # Shielded: a scraper that leaves must not cancel the merge the others wait on.
        return await asyncio.shield(self._running)

    def _bound(self, deadline: float, budget: ScrapeBudget) -> None:
        """Move the running merge's deadline for Triton to ``deadline`` if that is earlier."""
        if self._deadline is not None and self._deadline <= deadline:
            return
        self._deadline, self._deadline_budget = deadline, budget
        cut = self._cut
        # Not yet started, the fetch reads self._deadline when it starts; expired, it is being
        # cancelled already (and reschedule() would raise); done, Triton has answered.
        if cut is not None and not cut.expired():
            cut.reschedule(deadline)

    async def aclose(self) -> None:
        """Cancel the merge in flight (its scrapes are past the grace period) and close the
        connection to Triton."""
        if self._running is not None:
            self._running.cancel()
        await self._triton.aclose()

    def _finished(self, task: asyncio.Task[Body]) -> None:
        self._running = None
        if not task.cancelled() and task.exception() is None:
            self._last = task.result()

    async def _merge(self) -> Body:
        # The request leaves first: Triton answers while the files are read in a thread.
        fetch = asyncio.ensure_future(self._fetch())
        files = await asyncio.to_thread(self._read_files)
        text, triton_s = await fetch
        families = await asyncio.to_thread(self._build, files, text, triton_s)
        return Body(families, time.monotonic())

    async def _fetch(self) -> tuple[str | TritonScrapeError, float]:
        start = time.monotonic()
        text: str | TritonScrapeError
        try:
            async with asyncio.timeout_at(self._deadline) as cut:
                self._cut = cut
                text = await self._triton.fetch()
        except TritonScrapeError as exc:  # Triton's configured timeout among them
            text = exc
        except TimeoutError:  # the scrape's deadline: fetch() turns its own into the above
            text = TritonScrapeError("timeout", self._budget_message())
        except Exception as exc:  # a bug must cost the source, never the scrape
            text = TritonScrapeError("internal", repr(exc))
        finally:
            self._cut = None
        return text, time.monotonic() - start

    def _budget_message(self) -> str:
        budget = self._deadline_budget
        if budget is None:  # only a deadline set with its budget can expire
            return f"{self._triton.url}: did not answer within the scrape's deadline"
        # Constant while Prometheus's scrape_timeout is, so logged once.
        return (
            f"{self._triton.url}: did not answer within the scrape timeout the scraper sent "
            f"({budget.timeout_s:g} s, less {budget.margin_s:g} s to answer)"
        )

    def _read_files(self) -> tuple[MultiprocResult | SourceError, float]:
        start = time.monotonic()
        try:
            result: MultiprocResult | SourceError = self._files.read()
        except OSError as exc:
            result = SourceError("read_dir", f"{self._directory}: {exc}")
        except Exception as exc:  # a bug must cost the source, never the scrape
            result = SourceError("internal", repr(exc))
        return result, time.monotonic() - start

    def _build(
        self,
        files: tuple[MultiprocResult | SourceError, float],
        text: str | TritonScrapeError,
        triton_s: float,
    ) -> list[Metric]:
        health = self.health
        result, vllm_s = files
        vllm: list[Metric] = []
        if isinstance(result, MultiprocResult):
            health.ok(health.vllm, vllm_s)
            health.read_files(result)
            vllm = result.families
        else:
            health.fail(health.vllm, result.reason, str(result), vllm_s)
            health.files, health.corrupt = 0, ()
        triton: list[Metric] = []
        if isinstance(text, str):
            try:
                triton = to_metrics(parse_text_exposition(text, self._series_cache))
            except TritonScrapeError as exc:
                text = exc
            except Exception as exc:
                text = TritonScrapeError("internal", repr(exc))
        if isinstance(text, str):
            health.ok(health.triton, triton_s)
        else:
            health.fail(health.triton, text.reason, str(text), triton_s)
        # Counted before the merge, whose own families report it: the Triton families that
        # vLLM's files (or the proxy) already carry, which merge_families hides.
        taken = {f.name for f in vllm} | _OWN_NAMES
        health.duplicates = sum(1 for f in triton if f.name in taken)
        merged, _ = merge_families(
            [(health.families(), True), (vllm, True), (triton, False)], self._constant
        )
        return merged
