"""``python -m runtime.metrics_proxy`` as a process: ``--help``, stray arguments, and durations
that must be finite."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from runtime.metrics_proxy.settings import ProxySettings
from runtime.settings_env import variable_for
from tests.support.programs import run_program

_proxy = partial(run_program, "runtime.metrics_proxy")


def test_help_describes_the_program_and_every_variable_it_reads() -> None:
    done = _proxy("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m runtime.metrics_proxy [-h]")
    assert "The metrics proxy: serves /metrics" in done.stdout
    for name in ProxySettings.model_fields:
        assert f"  {variable_for(ProxySettings, name)} (default: " in done.stdout, name
    assert "  METRICS_PROXY_PORT (default: 9400)\n" in done.stdout
    assert "  METRICS_PROXY_MULTIPROC_DIR or PROMETHEUS_MULTIPROC_DIR (default: unset)\n" in (
        done.stdout
    )
    assert "  LLM_SERVING_COLOUR (default: '')\n" in done.stdout
    assert "metrics proxy serving" not in done.stderr


def test_any_other_argument_exits_2_with_the_usage_line() -> None:
    done = _proxy("--port=9500")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: python -m runtime.metrics_proxy [-h]\n")
    assert "unrecognized arguments: --port=9500" in done.stderr


@pytest.mark.parametrize(
    "variable",
    [
        "METRICS_PROXY_TRITON_TIMEOUT_S",
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
