"""``python -m runtime.metrics_proxy`` as a process: configuration errors and graceful shutdown."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.metrics_harness import ProxyProcess
from tests.support.triton_metrics_server import TritonMetricsServer


def _run_proxy(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m runtime.metrics_proxy`` under ``env``, for one that should exit at once."""
    return subprocess.run(
        [sys.executable, "-m", "runtime.metrics_proxy"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_missing_multiproc_dir_exits_1_naming_the_variable() -> None:
    out = _run_proxy({k: v for k, v in os.environ.items() if "MULTIPROC" not in k})
    assert out.returncode == 1
    assert "PROMETHEUS_MULTIPROC_DIR is not set" in out.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("METRICS_PROXY_PORT", "abc"),
        ("METRICS_PROXY_REUSE_S", "-1"),
        ("METRICS_PROXY_TRITON_URL", "http://127.0.0.1:99999/metrics"),
        ("METRICS_PROXY_TRITON_URL", "http://127.0.0.1:abc/metrics"),
        ("METRICS_PROXY_HOST", "no-such-host.invalid"),
    ],
)
def test_a_bad_variable_exits_1_with_one_line_naming_it(
    tmp_path: Path, variable: str, value: str
) -> None:
    out = _run_proxy({**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), variable: value})
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"metrics proxy: {variable}: "), out.stderr


def test_sigterm_finishes_the_scrape_in_flight(vllm_dir: Path) -> None:
    with (
        TritonMetricsServer(delay_s=1.0) as triton,
        ProxyProcess(vllm_dir, triton.url, METRICS_PROXY_TRITON_TIMEOUT_S="5") as proxy,
    ):
        triton.advance()
        before = triton.requests
        answers: list[httpx.Response] = []
        scrape = threading.Thread(
            target=lambda: answers.append(httpx.get(f"{proxy.url}/metrics", timeout=20))
        )
        scrape.start()
        while triton.requests == before:  # the scrape is now waiting on Triton
            time.sleep(0.02)
        assert proxy.stop(timeout_s=15) == 0
        scrape.join(timeout=20)
    assert len(answers) == 1 and answers[0].status_code == 200
    assert 'metrics_proxy_source_up{source="triton"} 1.0' in answers[0].text
    assert "nv_inference_request_success{" in answers[0].text


def test_cli_command_reports_configuration_errors(monkeypatch) -> None:
    from typer.testing import CliRunner

    from runtime.cli import app

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("METRICS_PROXY_MULTIPROC_DIR", raising=False)
    result = CliRunner().invoke(app, ["metrics-proxy"])
    assert result.exit_code == 1
    assert "PROMETHEUS_MULTIPROC_DIR is not set" in result.output
