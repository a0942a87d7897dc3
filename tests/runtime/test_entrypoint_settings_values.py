"""Commands that do not split into shell words, and two servers on one port, are refused when
the settings load (exit 2, one line naming the variable), not when stage 7 starts a server."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import pytest
from pydantic import ValidationError

from runtime.entrypoint import EntrypointSettings
from runtime.entrypoint.errors import ExitCode
from runtime.settings_env import setting_errors
from tests.runtime.pod import Pod

PORTS = {
    "public_grpc_port": 8001,
    "triton_http_port": 18000,
    "triton_metrics_port": 8002,
    "frontend_port": 8080,
    "health_port": 8081,
}


def _refusal(**settings: object) -> str:
    with pytest.raises(ValidationError) as caught:
        EntrypointSettings.model_validate(settings)
    return setting_errors(EntrypointSettings, caught.value)


@pytest.mark.parametrize("field", ["tritonserver", "frontend_command"])
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('tritonserver "--log-verbose=1', "(No closing quotation); close the quote"),
        ("tritonserver \\", "(No escaped character); close the quote"),
        ("", "names no command"),
        ("   ", "names no command"),
    ],
)
def test_command_that_does_not_split_is_refused(field: str, value: str, expected: str) -> None:
    line = _refusal(**{field: value})
    assert line.startswith(f"LLM_SERVING_{field.upper()}: ") and expected in line


def test_quoted_commands_still_split_into_their_words() -> None:
    settings = EntrypointSettings(
        tritonserver="'/opt/triton server/bin/tritonserver' --log-verbose=1",
        frontend_command="python3 -m runtime.frontend",
    )
    assert settings.tritonserver_argv() == [
        "/opt/triton server/bin/tritonserver",
        "--log-verbose=1",
    ]
    assert settings.frontend_argv() == ["python3", "-m", "runtime.frontend"]


@pytest.mark.parametrize(("first", "second"), list(combinations(PORTS, 2)))
def test_two_servers_on_one_port_are_refused(first: str, second: str) -> None:
    line = _refusal(**{**PORTS, second: PORTS[first]})
    assert line == (
        f"LLM_SERVING_{second.upper()}: Value error, port {PORTS[first]} is also "
        f"LLM_SERVING_{first.upper()}; give each port its own number (got {PORTS[first]})"
    )


def test_distinct_ports_are_accepted() -> None:
    assert EntrypointSettings.model_validate(PORTS).health_port == 8081


def _config_line(err: str) -> str:
    lines = [line for line in err.splitlines() if "invalid setting" in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_unclosed_quote_in_the_triton_command_exits_2_before_any_stage(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env["LLM_SERVING_TRITONSERVER"] = 'tritonserver "--x'
    code, err = pod.run_to_exit()
    assert code == ExitCode.CONFIG, err
    assert "invalid setting LLM_SERVING_TRITONSERVER: " in _config_line(err)
    assert "No closing quotation" in err and "stage 1" not in err


def test_health_port_on_the_public_grpc_port_exits_2_naming_both(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env["LLM_SERVING_HEALTH_PORT"] = pod.env["LLM_SERVING_PUBLIC_GRPC_PORT"]
    code, err = pod.run_to_exit()
    assert code == ExitCode.CONFIG, err
    line = _config_line(err)
    assert "invalid setting LLM_SERVING_HEALTH_PORT: " in line
    assert "is also LLM_SERVING_PUBLIC_GRPC_PORT" in line
