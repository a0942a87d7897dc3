"""``python -m runtime.metrics_proxy`` as a process: ``--help``, stray arguments, and durations
that must be finite."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

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
