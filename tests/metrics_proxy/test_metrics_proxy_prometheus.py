"""A real Prometheus scrapes two proxies over real writers and Triton's replay; queries check it.

``blue`` merges a live Triton replay with the vLLM writers; ``green`` reads the same files but
its Triton is down, as after a Triton crash. One Prometheus serves the whole module.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from contracts.promql import ALERTS_FILE, asset_text, load_alert_groups
from runtime.metrics_proxy.triton import parse_text_exposition
from tests.metrics_proxy.promql import all_expressions
from tests.support.metrics_harness import ProxyProcess, WriterProcesses
from tests.support.ports import free_port
from tests.support.prometheus import PrometheusServer
from tests.support.triton_metrics_server import TritonMetricsServer
from tests.support.vllm_metrics_writer import BRIDGED, FAMILIES, expected_sums

MODEL = "llama-3-8b"
PROCESSES = 4
TICKS = 3
TSV = Path(__file__).parent / "data" / "vllm-metrics.tsv"


@dataclass
class Live:
    prometheus: PrometheusServer
    triton: TritonMetricsServer
    writers: WriterProcesses
    blue: ProxyProcess
    green: ProxyProcess


def _value(result: list[dict]) -> float | None:
    return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("live")
    multiproc = base / "multiproc"
    multiproc.mkdir()
    rules = base / ALERTS_FILE
    rules.write_text(asset_text(ALERTS_FILE))
    pod = {"LLM_SERVING_MODEL_ID": MODEL}
    dead_triton = f"http://127.0.0.1:{free_port()}/metrics"
    with (
        WriterProcesses(multiproc, PROCESSES) as writers,
        TritonMetricsServer((MODEL,)) as triton,
        ProxyProcess(
            multiproc,
            triton.url,
            **pod,
            LLM_SERVING_MODEL_VERSION="v1",
            LLM_SERVING_COLOUR="blue",
        ) as blue,
        ProxyProcess(
            multiproc,
            dead_triton,
            **pod,
            LLM_SERVING_MODEL_VERSION="v2",
            LLM_SERVING_COLOUR="green",
            METRICS_PROXY_TRITON_TIMEOUT_S="0.3",
        ) as green,
        PrometheusServer(
            base / "prometheus",
            {"blue": blue.url.removeprefix("http://"), "green": green.url.removeprefix("http://")},
            [rules],
        ) as prometheus,
    ):
        prometheus.wait_until_scraped()
        # Each round reaches Prometheus through both proxies before the next one is written, so
        # rates and derivatives have a sample of every round. (A fixed pause between rounds let
        # one slow scrape on a loaded machine fold two rounds into one sample.)
        for tick in range(1, TICKS + 1):
            writers.tick()
            triton.advance()
            tokens = expected_sums(PROCESSES, tick)["vllm:prompt_tokens_total"]
            for colour in ("blue", "green"):
                _settle(prometheus, f'sum(vllm:prompt_tokens_total{{colour="{colour}"}})', tokens)
            _settle(prometheus, 'nv_inference_request_success{colour="blue"}', 90.0 * tick)
        yield Live(prometheus, triton, writers, blue, green)


def _settle(prometheus: PrometheusServer, promql: str, expected: float) -> None:
    """Wait until ``promql``'s one value is ``expected``; fail naming what it was instead."""
    result = prometheus.wait_for(promql, lambda r: _value(r) == expected)
    assert _value(result) == expected, (promql, result, prometheus.log())


def _names(prometheus: PrometheusServer, selector: str) -> set[str]:
    return {r["metric"]["__name__"] for r in prometheus.query(f"group by (__name__) ({selector})")}


def test_every_vllm_family_reaches_prometheus(live: Live) -> None:
    with TSV.open() as f:
        rows = [r for r in csv.reader(f, delimiter="\t") if r and not r[0].startswith("#")]
    assert len(rows) == 46 == len(FAMILIES)
    names = _names(live.prometheus, '{__name__=~"vllm:.*", colour="blue"}')
    for family, typ in rows:
        if typ == "counter":
            wanted = {family.removesuffix("_total") + "_total"}
        elif typ == "histogram":
            wanted = {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
        else:
            wanted = {family}
        assert wanted <= names, (family, wanted - names)


def test_vllm_values_are_the_sum_over_processes(live: Live) -> None:
    expected = expected_sums(PROCESSES, TICKS)
    # Triton's bridged families carry `version`; vLLM's own never do.
    result = live.prometheus.query(
        'sum by (__name__) ({__name__=~"vllm:.*", colour="blue", version=""})'
    )
    got = {r["metric"]["__name__"]: float(r["value"][1]) for r in result}
    assert got == pytest.approx(expected)


def test_triton_families_and_values_reach_prometheus(live: Live) -> None:
    vllm_names = {spec.name.removesuffix("_total") for spec in FAMILIES}
    for family in parse_text_exposition(live.triton.exposition()):
        if family.name in vllm_names:
            continue
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sample.labels)
            query = f'{sample.name}{{{labels}{"," if labels else ""}colour="blue"}}'
            assert _value(live.prometheus.query(query)) == sample.value, query


def test_bridged_duplicates_appear_once(live: Live) -> None:
    # Families both sources carry come only from vLLM's files (no Triton `version` label);
    # the bridged family vLLM does not write still comes from Triton.
    from_triton = _names(live.prometheus, '{__name__=~"vllm:.*", colour="blue", version!=""}')
    assert from_triton == {
        "vllm:time_per_output_token_seconds_bucket",
        "vllm:time_per_output_token_seconds_sum",
        "vllm:time_per_output_token_seconds_count",
    }
    assert "vllm:time_per_output_token_seconds" in BRIDGED
    assert len(live.prometheus.query('vllm:prompt_tokens_total{colour="blue"}')) == 2
    for accept in ("text/plain", "application/openmetrics-text; version=1.0.0"):
        body = httpx.get(f"{live.blue.url}/metrics", headers={"Accept": accept}).text
        series = [line.rsplit(" ", 1)[0] for line in body.splitlines() if line[:1] not in "#"]
        assert len(series) == len(set(series)) > 500, accept


def test_sources_up_and_triton_down_is_still_a_good_scrape(live: Live) -> None:
    # Health is the last scrape's: polled, since one scrape that a loaded machine let run past
    # the 2 s scrape timeout reads as down. A proxy whose scrapes keep failing still fails.
    deadline = time.monotonic() + 30
    while live.prometheus.targets_up() != {"blue": True, "green": True}:
        assert time.monotonic() < deadline, live.prometheus.targets_up()
        time.sleep(0.2)
    up = live.prometheus.query("metrics_proxy_source_up")
    by = {(r["metric"]["colour"], r["metric"]["source"]): float(r["value"][1]) for r in up}
    assert by == {
        ("blue", "triton"): 1.0,
        ("blue", "vllm"): 1.0,
        ("green", "triton"): 0.0,
        ("green", "vllm"): 1.0,
    }
    errors = live.prometheus.query(
        'metrics_proxy_source_errors_total{colour="green", source="triton", reason="connect"}'
    )
    assert (_value(errors) or 0) > 0
    # vLLM's series still come through the proxy whose Triton is down.
    assert _value(live.prometheus.query('sum(vllm:prompt_tokens_total{colour="green"})'))


def test_every_shipped_expression_returns_data(live: Live) -> None:
    empty = []
    for expr in all_expressions(MODEL, "v1", "blue"):
        if not live.prometheus.query(expr.promql):
            empty.append((expr.origin, expr.promql))
    assert empty == []


def test_prometheus_evaluates_every_alert_as_pending(live: Live) -> None:
    names = {rule["alert"] for group in load_alert_groups() for rule in group["rules"]}
    result = live.prometheus.wait_for(
        "ALERTS",
        lambda r: {x["metric"]["alertname"] for x in r} >= names,
        timeout_s=30,
    )
    assert {r["metric"]["alertname"] for r in result} == names
