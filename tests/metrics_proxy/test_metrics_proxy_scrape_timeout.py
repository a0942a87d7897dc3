"""The scrape timeout Prometheus sends (``X-Prometheus-Scrape-Timeout-Seconds``) bounds the wait
for a slow Triton, so that Prometheus gets vLLM's series with Triton marked down instead of a
failed scrape; a header that is no usable number is ignored.

Margins are wide for a loaded machine: Triton sleeps 5 s, the budget is 0.5 s (0.25 s of wait),
and an answer within 3 s can only be the budget's.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime.metrics_proxy.budget import ScrapeBudget, scrape_budget
from runtime.metrics_proxy.multiproc import MultiprocResult
from runtime.metrics_proxy.scrape import Scraper
from runtime.metrics_proxy.triton import TritonClient
from tests.metrics_proxy.conftest import make_settings
from tests.support.metrics_harness import ProxyProcess
from tests.support.prometheus import PrometheusServer
from tests.support.triton_metrics_server import TritonMetricsServer

HEADER = "X-Prometheus-Scrape-Timeout-Seconds"


def _values(text: str, name: str, **labels: str) -> list[float]:
    """The values of the samples named ``name`` whose labels include ``labels``."""
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    ]


def _triton(text: str) -> tuple[float, float]:
    """``(up, timeout errors)`` of Triton's source in an exposition."""
    (up,) = _values(text, "metrics_proxy_source_up", source="triton")
    (errors,) = _values(
        text, "metrics_proxy_source_errors_total", source="triton", reason="timeout"
    )
    return up, errors


def _has_vllm(text: str) -> bool:
    return any(f.name.startswith("vllm:") for f in text_string_to_metric_families(text))


async def _timed(proxy, **headers: str) -> tuple[str, float]:
    """A scrape's body and how long it took, failing (not hanging) past 30 s."""
    started = time.monotonic()
    response = await asyncio.wait_for(proxy.metrics(**headers), timeout=30)
    return response.text, time.monotonic() - started


async def test_a_slow_triton_is_cut_within_the_scrape_timeout(vllm_dir: Path, proxy_factory):
    with TritonMetricsServer(delay_s=5.0) as slow:
        # Configured far above Triton's delay: only the header can cut the wait short.
        proxy = await proxy_factory(make_settings(vllm_dir, slow.url, triton_timeout_s=30))
        text, took = await _timed(proxy, **{HEADER: "0.5"})
        assert took < 3, f"answered after {took:.1f} s: the 0.5 s scrape timeout was ignored"
        assert slow.requests == 1
        assert _triton(text) == (0.0, 1.0)
        assert _values(text, "metrics_proxy_source_up", source="vllm") == [1.0]
        assert _has_vllm(text)
        assert not any(f.name.startswith("nv_") for f in text_string_to_metric_families(text))
        health = (await proxy.client.get("/healthz")).json()
        assert health["sources"] == {"triton": False, "vllm": True}
        # The cut fetch leaves no broken connection behind: a fast Triton is read again.
        slow.delay_s = 0.0
        text, _ = await _timed(proxy, **{HEADER: "10"})
        assert _triton(text) == (1.0, 1.0)


async def test_a_scrape_with_a_budget_cuts_the_merge_it_joins(vllm_dir: Path, proxy_factory):
    """Scrapes share merges: one without the header started it, the one with a budget must
    still be answered in time, and both get the same body."""
    with TritonMetricsServer(delay_s=5.0) as slow:
        proxy = await proxy_factory(make_settings(vllm_dir, slow.url, triton_timeout_s=30))
        patient = asyncio.create_task(_timed(proxy))
        deadline = time.monotonic() + 30
        while slow.requests == 0:  # the first scrape's merge now waits on Triton
            assert time.monotonic() < deadline, "the scrape never reached Triton"
            await asyncio.sleep(0.01)
        text, took = await _timed(proxy, **{HEADER: "0.5"})
        assert took < 3, f"answered after {took:.1f} s: the 0.5 s scrape timeout was ignored"
        first, _ = await asyncio.wait_for(patient, timeout=30)
        assert slow.requests == 1
        assert first == text
        assert _triton(text) == (0.0, 1.0) and _has_vllm(text)


async def test_the_configured_timeout_bounds_a_longer_scrape_timeout(vllm_dir: Path, proxy_factory):
    with TritonMetricsServer(delay_s=5.0) as slow:
        proxy = await proxy_factory(make_settings(vllm_dir, slow.url, triton_timeout_s=0.3))
        text, took = await _timed(proxy, **{HEADER: "600"})
        assert took < 3, f"answered after {took:.1f} s"
        assert _triton(text) == (0.0, 1.0) and _has_vllm(text)


@pytest.mark.parametrize(
    "value",
    ["abc", "-1", "-0.5", "NaN", "nan", "inf", "-Infinity", "1e999", "0", "", "0x1p-2", "1,5"],
)
async def test_a_malformed_scrape_timeout_is_ignored(vllm_dir: Path, proxy_factory, value: str):
    """Read as a number, each of these would cut Triton's 0.3 s answer (negative, zero or tiny)
    or break the deadline (NaN); ignored, the configured timeout alone applies."""
    with TritonMetricsServer(delay_s=0.3) as slow:
        proxy = await proxy_factory(make_settings(vllm_dir, slow.url, triton_timeout_s=30))
        text, _ = await _timed(proxy, **{HEADER: value})
        assert _triton(text) == (1.0, 0.0)
        assert _has_vllm(text)
        assert (await proxy.client.get("/healthz")).status_code == 200


async def test_a_header_that_is_not_text_is_ignored(vllm_dir: Path, triton, proxy_factory):
    proxy = await proxy_factory(make_settings(vllm_dir, triton.url))
    for value in (b"\xff\xfe", b"\xd9\xa1", "9" * 5000):  # not UTF-8, an Arabic 1, huge
        response = await proxy.client.get("/metrics", headers={HEADER: value})
        assert response.status_code == 200
        assert _triton(response.text) == (1.0, 0.0)


def test_prometheus_gets_every_answer_from_a_proxy_whose_triton_is_slow(
    vllm_dir: Path, tmp_path: Path
) -> None:
    """A real Prometheus (scrape timeout 2 s, sent in the header) and a Triton slower than that.
    Without the budget most scrapes time out, losing vLLM's series too: only one that joins a
    merge near its end is answered (Triton up), so three in a row never succeed."""
    with (
        TritonMetricsServer(delay_s=5.0) as slow,
        ProxyProcess(vllm_dir, slow.url, METRICS_PROXY_TRITON_TIMEOUT_S="30") as proxy,
        PrometheusServer(tmp_path, {"slow": proxy.url.removeprefix("http://")}) as prometheus,
    ):
        # Polled: one scrape a loaded machine slows past the 2 s timeout reads as down.
        in_a_row = (
            'count_over_time(up{job="slow"}[7s]) >= 3 and min_over_time(up{job="slow"}[7s]) == 1'
        )
        assert prometheus.wait_for(in_a_row, bool, timeout_s=40), prometheus.log()
        # Over a window: a scrape that failed leaves stale markers, which these skip.
        up = prometheus.query('max_over_time(metrics_proxy_source_up{source="triton"}[10s])')
        assert [float(r["value"][1]) for r in up] == [0.0]
        errors = prometheus.query(
            'max_over_time(metrics_proxy_source_errors_total{source="triton",reason="timeout"}[10s])'
        )
        assert float(errors[0]["value"][1]) > 0
        assert prometheus.query("last_over_time(vllm:prompt_tokens_total[10s])")
        assert httpx.get(f"{proxy.url}/healthz").json()["sources"]["vllm"] is True


@pytest.mark.parametrize(
    ("value", "offset_s", "expected"),
    [
        ("10", 0.5, ScrapeBudget(10.0, 0.5)),  # Prometheus's default scrape_timeout
        ("2.5", 0.5, ScrapeBudget(2.5, 0.5)),
        (" 1e1\t", 0.5, ScrapeBudget(10.0, 0.5)),
        (".75", 0.0, ScrapeBudget(0.75, 0.0)),
        # No longer than the offset: half of it is still waited.
        ("0.5", 0.5, ScrapeBudget(0.5, 0.25)),
        ("0.2", 0.5, ScrapeBudget(0.2, 0.1)),
    ],
)
def test_the_budget_is_the_timeout_less_the_offset(
    value: str, offset_s: float, expected: ScrapeBudget
) -> None:
    budget = scrape_budget(value, offset_s)
    assert budget == expected
    assert budget is not None and 0 < budget.wait_s <= budget.timeout_s


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        " ",
        "abc",
        "-1",
        "+1",
        "NaN",
        "inf",
        "Infinity",
        "1e999",
        "0",
        "0.0",
        "1e-999",
        "0x10",
        "1_0",
        "1,5",
        "1.5s",
        "\u0661",
        "ÿþ",
        "1 2",
    ],
)
def test_no_budget_from_a_value_that_is_no_positive_number(value: str | None) -> None:
    assert scrape_budget(value, 0.5) is None


class _Hanging(TritonClient):
    """A Triton that never answers and counts its fetches."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9/metrics", 600.0, 1 << 20)
        self.fetches = 0

    async def fetch(self) -> str:
        self.fetches += 1
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class _NoFiles:
    def read(self) -> MultiprocResult:
        return MultiprocResult([], 0, ())


@pytest.mark.parametrize("during_the_fetch", [True, False], ids=["during", "before"])
@pytest.mark.parametrize("budgets", [(None, 0.5), (0.5, None), (1.0, 600.0), (600.0, 1.0)])
async def test_scrapes_sharing_a_merge_share_its_earliest_deadline(
    tmp_path: Path, budgets: tuple[float | None, float | None], during_the_fetch: bool
) -> None:
    """However the scrapes arrive (the second one while Triton's fetch is under way, or before
    it has started), the merge they share waits for Triton until the earliest deadline any of
    them set, and all get its body."""
    triton = _Hanging()
    scraper = Scraper(triton, _NoFiles(), tmp_path, (), reuse_s=0.0)
    first_budget, second_budget = (None if b is None else ScrapeBudget(b, 0.0) for b in budgets)
    try:
        started = time.monotonic()
        first = asyncio.create_task(scraper.body(first_budget))
        while during_the_fetch and triton.fetches == 0:  # the merge waits on Triton now
            await asyncio.sleep(0.01)
        # Created before the first has run, the second task joins before the fetch starts.
        second = asyncio.create_task(scraper.body(second_budget))
        both = await asyncio.wait_for(asyncio.gather(first, second), timeout=30)
        assert time.monotonic() - started < 10, "the later deadline was waited for"
    finally:
        await scraper.aclose()
    assert both[0] is both[1] and triton.fetches == 1
    assert scraper.health.triton.up is False
    assert scraper.health.triton.errors["timeout"] == 1
    shortest = min(b for b in budgets if b is not None)
    assert f"({shortest:g} s, less 0 s to answer)" in scraper.health.triton.last_error
