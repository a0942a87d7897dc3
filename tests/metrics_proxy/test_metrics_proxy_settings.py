"""``python -m runtime.metrics_proxy`` as a process: ``--help``, stray arguments, and durations
that must be finite."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest

from runtime.metrics_proxy.app import ProxyConfigError, create_app
from runtime.metrics_proxy.settings import ProxySettings
from tests.support.programs import check_help, check_refused_arguments, run_program

_proxy = partial(run_program, "runtime.metrics_proxy")


def test_help_describes_the_program_and_every_variable_it_reads() -> None:
    stderr = check_help(
        "runtime.metrics_proxy",
        ProxySettings,
        "The metrics proxy: serves /metrics",
        "  METRICS_PROXY_PORT (default: 9400)\n",
        "  METRICS_PROXY_MULTIPROC_DIR or PROMETHEUS_MULTIPROC_DIR (default: unset)\n",
        "  LLM_SERVING_COLOUR (default: '')\n",
    )
    assert "metrics proxy serving" not in stderr


def test_any_other_argument_exits_2_with_the_usage_line() -> None:
    stderr = check_refused_arguments("runtime.metrics_proxy", "--port=9500")
    assert "unrecognized arguments: --port=9500" in stderr


@pytest.mark.parametrize(
    "variable",
    [
        "METRICS_PROXY_TRITON_TIMEOUT_S",
        "METRICS_PROXY_SCRAPE_TIMEOUT_OFFSET_S",
        "METRICS_PROXY_REUSE_S",
        "METRICS_PROXY_GRACEFUL_SHUTDOWN_S",
        "METRICS_PROXY_IDLE_TIMEOUT_S",
    ],
)
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_an_infinite_duration_exits_1_naming_the_variable(
    tmp_path: Path, variable: str, value: str
) -> None:
    done = _proxy(env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), variable: value})
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line == f"metrics proxy: {variable}: Input should be a finite number (got {value!r})"


@pytest.mark.parametrize(
    "url", ["http://[::1/metrics", "http://127.0.0.1:99999/metrics", "https://127.0.0.1/metrics"]
)
def test_an_unusable_triton_url_exits_1_with_one_line(tmp_path: Path, url: str) -> None:
    done = _proxy(env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "METRICS_PROXY_TRITON_URL": url})
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith("metrics proxy: METRICS_PROXY_TRITON_URL: ") and repr(url) in line


def test_marking_dead_processes_needs_a_writable_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory mounted read-only (as the pod's sidecar mounts it) cannot lose files: asked to
    mark dead processes there, the proxy refuses to start. As root, only a read-only mount
    would deny the write, so ``os.access`` answers as one does."""
    real_access = os.access

    def read_only(path: object, mode: int, **kwargs: object) -> bool:
        if Path(str(path)) == tmp_path and mode & os.W_OK:
            return False
        return real_access(path, mode, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "access", read_only)
    settings = ProxySettings(multiproc_dir=tmp_path, mark_dead_processes=True)
    with pytest.raises(ProxyConfigError, match=r"METRICS_PROXY_MARK_DEAD_PROCESSES .* read-only"):
        create_app(settings)
    create_app(settings.model_copy(update={"mark_dead_processes": False}))
