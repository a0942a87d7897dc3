"""The proxy's /metrics: formats, gzip, labels, duplicates, per-source health and Triton faults."""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

from runtime.metrics_proxy.app import ProxyConfigError, create_app
from runtime.metrics_proxy.exposition import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT
from runtime.metrics_proxy.settings import ProxySettings
from runtime.metrics_proxy.triton import parse_text_exposition
from tests.metrics_proxy.conftest import POD_LABELS, make_settings
from tests.support.ports import free_port
from tests.support.prometheus import UPSTREAM_NAMING
from tests.support.triton_metrics_server import TritonMetricsServer
from tests.support.vllm_metrics_writer import FAMILIES, expected_sums

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def _key(name: str, labels: dict[str, str]) -> str:
    """A series as ``name{k="v",...}`` with the labels sorted (prometheus_client's order)."""
    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{text}}}"


def _pod(name: str, **labels: str) -> str:
    """The key of a series that carries ``labels`` and the pod's labels."""
    return _key(name, {**labels, **POD_LABELS})


def _series(text: str) -> dict[str, float]:
    out = {}
    for family in parse_text(text.removesuffix("# EOF\n")):
        for sample in family.samples:
            key = _key(sample.name, sample.labels)
            assert key not in out, f"duplicate series {key}"
            out[key] = sample.value
    return out


def _sums(text: str, prefix: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    for key, value in _series(text).items():
        name = key.split("{", 1)[0]
        if name.startswith(prefix) and 'version="' not in key.replace("model_version", ""):
            sums[name] = sums.get(name, 0.0) + value
    return sums


async def test_text_exposition_passes_promtool(vllm_dir: Path, triton, proxy_factory) -> None:
    proxy = await proxy_factory(make_settings(vllm_dir, triton.url))
    response = await proxy.metrics()
    assert response.headers["content-type"] == CONTENT_TYPE_TEXT
    out = subprocess.run(
        ["promtool", "check", "metrics"], input=response.content, capture_output=True
    )
    # promtool parses (exit 1 on a format error) and lints names (exit 3). The only lint
    # findings allowed are about names Triton and vLLM chose, which the proxy must keep.
    assert out.returncode in (0, 3), out.stderr.decode()
    assert b"error while linting" not in out.stderr, out.stderr.decode()
    for line in (out.stdout + out.stderr).decode().splitlines():
        name, _, problem = line.partition(" ")
        assert name.startswith(("vllm:", "nv_")) and problem in UPSTREAM_NAMING, line


async def test_openmetrics_parses_strictly_and_matches_text(
    vllm_dir: Path, triton, proxy_factory
) -> None:
    proxy = await proxy_factory(make_settings(vllm_dir, triton.url))
    om = await proxy.metrics(accept=OPENMETRICS)
    assert om.headers["content-type"] == CONTENT_TYPE_OPENMETRICS
    assert om.text.endswith("# EOF\n")
    families = list(parse_openmetrics(om.text))
    names = {f.name for f in families}
    assert "vllm:prompt_tokens" in names and "nv_inference_request_success" in names
    text = await proxy.metrics(accept="text/plain")
    # Same series in both formats (the duration gauges change between two scrapes).
    assert {k for k in _series(om.text) if "duration_seconds" not in k} == {
        k for k in _series(text.text) if "duration_seconds" not in k
    }


async def test_gzip_when_asked(vllm_dir: Path, triton, proxy_factory) -> None:
    proxy = await proxy_factory(make_settings(vllm_dir, triton.url))
    plain = await proxy.metrics(**{"accept-encoding": "identity"})
    assert "content-encoding" not in plain.headers
    # httpx decodes gzip transparently: read the raw bytes to prove they are compressed.
    async with proxy.client.stream("GET", "/metrics", headers={"accept-encoding": "gzip"}) as r:
        assert r.headers["content-encoding"] == "gzip"
        raw = b"".join([chunk async for chunk in r.aiter_raw()])
    unzipped = gzip.decompress(raw).decode()
    assert len(raw) < len(unzipped) / 3
    assert set(_series(unzipped)) == set(_series(plain.text))


async def test_values_labels_and_no_duplicates(vllm_dir: Path, triton, proxy_factory) -> None:
    proxy = await proxy_factory(make_settings(vllm_dir, triton.url))
    text = (await proxy.metrics()).text
    series = _series(text)
    for key in series:
        assert all(f'{k}="{v}"' in key for k, v in POD_LABELS.items()), f"{key}: no pod labels"
    assert _sums(text, "vllm:") == pytest.approx(expected_sums(2, 2))
    for family in parse_text_exposition(triton.exposition()):
        if family.name in {s.name.removesuffix("_total") for s in FAMILIES}:
            continue  # bridged: vLLM's complete copy wins
        for sample in family.samples:
            key = _pod(sample.name, **dict(sample.labels))
            assert series[key] == sample.value, key
    assert series[_pod("metrics_proxy_duplicate_families")] == 7.0


async def test_triton_down_gives_vllm_metrics_and_up_zero(vllm_dir: Path, proxy_factory) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    proxy = await proxy_factory(make_settings(vllm_dir, url))
    text = (await proxy.metrics()).text
    series = _series(text)
    assert series[_pod("metrics_proxy_source_up", source="triton")] == 0.0
    assert series[_pod("metrics_proxy_source_up", source="vllm")] == 1.0
    errors = _pod("metrics_proxy_source_errors_total", source="triton", reason="connect")
    assert series[errors] == 1.0
    assert not any(k.startswith("nv_") for k in series)
    assert _sums(text, "vllm:") == pytest.approx(expected_sums(2, 2))
    health = (await proxy.client.get("/healthz")).json()
    assert health == {"status": "ok", "sources": {"triton": False, "vllm": True}}


async def test_triton_slow_is_cut_at_the_timeout(vllm_dir: Path, proxy_factory) -> None:
    with TritonMetricsServer(delay_s=20.0) as slow:
        proxy = await proxy_factory(make_settings(vllm_dir, slow.url, triton_timeout_s=0.2))
        # Bounded well under the Triton delay: the proxy must not wait for it. The margin is
        # wide both ways, as a loaded machine can take seconds over a 0.2 s scrape.
        response = await asyncio.wait_for(proxy.metrics(), timeout=10)
        series = _series(response.text)
    assert series[_pod("metrics_proxy_source_up", source="triton")] == 0.0
    assert series[_pod("metrics_proxy_source_errors_total", source="triton", reason="timeout")]
    assert any(k.startswith("vllm:kv_cache_usage_perc") for k in series)


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b'nv_x{model="a" 1\n', 200, "parse"),
        (b"oops", 500, "http_status"),
        # Bodies Prometheus would refuse the whole scrape over, were they passed on.
        (b"foo.bar 1\n", 200, "parse"),
        ("f\u00e9 1\n".encode(), 200, "parse"),
        (b"# TYPE foo bogus\nfoo 1\n", 200, "parse"),
        (b'foo{a="1",a="2"} 1\n', 200, "parse"),
        (b'foo{__name__="x"} 1\n', 200, "parse"),
        # Only spaces and tabs separate a line's tokens.
        ("nv_x\u00a01\n".encode(), 200, "parse"),
        (b'nv_x{model="a"} 1\x0b\n', 200, "parse"),
        (b"# TYPE nv_x gauge\x0c\nnv_x 1\n", 200, "parse"),
    ],
)
async def test_triton_bad_answers_count_by_reason(
    vllm_dir: Path, proxy_factory, body: bytes, status: int, reason: str
) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    class Bad(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Bad)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        proxy = await proxy_factory(make_settings(vllm_dir, url))
        series = _series((await proxy.metrics()).text)
    finally:
        server.shutdown()
        server.server_close()
    assert series[_pod("metrics_proxy_source_up", source="triton")] == 0.0
    assert series[_pod("metrics_proxy_source_errors_total", source="triton", reason=reason)]
    assert series[_pod("metrics_proxy_source_up", source="vllm")] == 1.0
    assert any(key.startswith("vllm:") for key in series)


async def test_concurrent_scrapes_share_one_collection(vllm_dir: Path, proxy_factory) -> None:
    # Triton answers slowly enough that all ten scrapes arrive while the first one's fetch
    # waits, even on a loaded machine (0.3 s was sometimes less than the ten connects took).
    with TritonMetricsServer(delay_s=2.0) as slow:
        slow.advance()
        proxy = await proxy_factory(make_settings(vllm_dir, slow.url, triton_timeout_s=10))
        responses = await asyncio.gather(*(proxy.metrics() for _ in range(10)))
        assert slow.requests == 1
    assert len({r.text for r in responses}) == 1


async def test_a_recent_merge_is_served_again_within_reuse_s(
    vllm_dir: Path, triton, proxy_factory
) -> None:
    fresh = await proxy_factory(make_settings(vllm_dir, triton.url, reuse_s=0.0))
    reusing = await proxy_factory(make_settings(vllm_dir, triton.url, reuse_s=60.0))
    before = triton.requests
    await fresh.metrics()
    await fresh.metrics()
    assert triton.requests == before + 2
    first = (await reusing.metrics()).text
    triton.advance()
    assert (await reusing.metrics()).text == first
    assert triton.requests == before + 3


async def test_missing_or_corrupt_vllm_files_never_fail_the_scrape(
    vllm_dir: Path, triton, proxy_factory, tmp_path: Path
) -> None:
    gone = await proxy_factory(make_settings(tmp_path / "missing", triton.url))
    series = _series((await gone.metrics()).text)
    assert series[_pod("metrics_proxy_source_up", source="vllm")] == 0.0
    assert series[_pod("metrics_proxy_source_errors_total", source="vllm", reason="read_dir")]
    assert series[_pod("metrics_proxy_source_up", source="triton")] == 1.0

    mixed = tmp_path / "mixed"
    shutil.copytree(vllm_dir, mixed)
    (mixed / "histogram_4242.db").write_bytes(b"\x10\x00")
    proxy = await proxy_factory(make_settings(mixed, triton.url))
    for scrape in (1, 2):
        text = (await proxy.metrics()).text
        series = _series(text)
        errors = _pod("metrics_proxy_source_errors_total", source="vllm", reason="corrupt_file")
        assert series[errors] == scrape
        assert series[_pod("metrics_proxy_multiproc_corrupt_files")] == 1.0
        assert series[_pod("metrics_proxy_source_up", source="vllm")] == 1.0
        assert _sums(text, "vllm:") == pytest.approx(expected_sums(2, 2))


async def test_routes(vllm_dir: Path, triton, proxy_factory) -> None:
    proxy = await proxy_factory(make_settings(vllm_dir, triton.url))
    assert (await proxy.client.get("/nope")).status_code == 404
    assert (await proxy.client.post("/metrics")).status_code == 405
    head = await proxy.client.head("/metrics")
    assert head.status_code == 200 and head.content == b""


# A vLLM plugin's metrics with names prometheus_client accepts (UTF-8) but that neither
# exposition format allows unquoted; and a legal name the first one collides with once made legal.
PLUGIN_WRITER = """
from prometheus_client import Counter, Gauge
Counter("plugin.requests", "Requests a plugin saw", ["route-name"]).labels("chat").inc(3)
Counter("plugin_requests", "The same, legally named", ["route_name"]).labels("chat").inc(2)
Gauge("9lives", "Starts with a digit", multiprocess_mode="max").set(9)
"""


async def test_names_a_plugin_wrote_are_made_legal(
    vllm_dir: Path, triton, proxy_factory, tmp_path: Path
) -> None:
    """One illegal name must not lose the whole scrape (Prometheus 2 refuses the body): each
    character a legacy name may not hold becomes ``_``, as prometheus_client's ``underscores``
    escaping writes it, and ``vllm:`` names keep their colon."""
    directory = tmp_path / "multiproc"
    shutil.copytree(vllm_dir, directory)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    subprocess.run([sys.executable, "-c", PLUGIN_WRITER], env=env, check=True)
    proxy = await proxy_factory(make_settings(directory, triton.url))
    text = (await proxy.metrics()).text
    out = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
    assert out.returncode in (0, 3), out.stderr.decode()
    series = _series(text)
    assert series[_pod("plugin_requests_total", route_name="chat")] == 5.0
    assert series[_pod("_9lives")] == 9.0
    assert any(key.startswith("vllm:prompt_tokens_total{") for key in series)
    om = (await proxy.metrics(accept=OPENMETRICS)).text
    names = {family.name for family in parse_openmetrics(om)}
    assert {"plugin_requests", "_9lives", "vllm:prompt_tokens"} <= names


def test_missing_multiproc_dir_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("METRICS_PROXY_MULTIPROC_DIR", raising=False)
    with pytest.raises(ProxyConfigError, match="PROMETHEUS_MULTIPROC_DIR"):
        create_app(ProxySettings())


def test_pod_labels_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_SERVING_MODEL_ID", "m")
    monkeypatch.setenv("LLM_SERVING_MODEL_VERSION", "2026-11-01")
    monkeypatch.setenv("LLM_SERVING_COLOUR", "blue")
    assert ProxySettings().constant_labels() == (
        ("model_id", "m"),
        ("model_version", "2026-11-01"),
        ("colour", "blue"),
    )


async def test_failures_are_logged_once_per_change(
    vllm_dir: Path, proxy_factory, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(vllm_dir, mixed)
    (mixed / "histogram_4242.db").write_bytes(b"\x10\x00")
    proxy = await proxy_factory(make_settings(mixed, f"http://127.0.0.1:{free_port()}/metrics"))
    with caplog.at_level(logging.WARNING, logger="runtime.metrics_proxy.scrape"):
        for _ in range(3):
            await proxy.metrics()
        # Warnings are logged after a scrape is answered, before the next merge starts: once
        # this fourth one is answered, all three scrapes' warnings are in.
        await proxy.metrics()
    messages = [record.getMessage() for record in caplog.records]
    assert sum("metrics source triton failed (connect)" in m for m in messages) == 1, messages
    assert sum("skipping corrupt files: histogram_4242.db" in m for m in messages) == 1, messages
