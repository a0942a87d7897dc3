"""``python -m runtime.frontend`` as a process: ``--help``, stray arguments, and bad settings
reported in one line that names the environment variable."""

from __future__ import annotations

from functools import partial

import pytest

from runtime.frontend.settings import FrontendSettings
from tests.support.programs import check_help, check_refused_arguments, run_program
from tests.support.tiny_llm import TinyLlm

_frontend = partial(run_program, "runtime.frontend")


def test_help_describes_the_program_and_every_variable_it_reads() -> None:
    stderr = check_help(
        "runtime.frontend",
        FrontendSettings,
        "OpenAI-compatible HTTP API",
        "  LLM_SERVING_FRONTEND_PORT (default: 8080)\n      Port uvicorn binds.",
        "  LLM_SERVING_FRONTEND_TOKENIZER_DIR (default: unset)\n",
    )
    assert "Uvicorn running" not in stderr


def test_any_other_argument_exits_2_with_the_usage_line() -> None:
    stderr = check_refused_arguments("runtime.frontend", "--port", "9000")
    assert "unrecognized arguments: --port 9000" in stderr


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("LLM_SERVING_FRONTEND_PORT", "abc", "valid integer"),
        ("LLM_SERVING_FRONTEND_PORT", "70000", "less than or equal to 65535"),
        ("LLM_SERVING_FRONTEND_REQUEST_TIMEOUT_S", "0", "greater than 0"),
        ("LLM_SERVING_FRONTEND_TOOL_CALL_PARSER", "mistral", "'hermes'"),
    ],
)
def test_a_bad_setting_exits_1_with_one_line_naming_the_variable(
    variable: str, value: str, problem: str
) -> None:
    done = _frontend(env={variable: value})
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"llm-serving frontend: invalid setting {variable}: "), line
    assert problem in line and f"(got {value!r})" in line


def test_idle_connections_outlive_client_pools(
    monkeypatch: pytest.MonkeyPatch, tiny_llm: TinyLlm
) -> None:
    # uvicorn's own 5 s equals the openai SDK's pool expiry: a request sent after a 5 s pause
    # could reuse a connection the server was closing (seen as APIConnectionError).
    from runtime.frontend import __main__ as frontend_main

    served: dict[str, object] = {}
    monkeypatch.setattr(frontend_main.uvicorn, "run", lambda app, **kw: served.update(kw))
    monkeypatch.setattr(frontend_main.signal, "signal", lambda *_: None)
    monkeypatch.setenv("LLM_SERVING_FRONTEND_MAX_MODEL_LEN", "128")
    monkeypatch.setenv("LLM_SERVING_FRONTEND_TOKENIZER_DIR", str(tiny_llm.path))
    assert frontend_main.main([]) == 0
    assert served["timeout_keep_alive"] == 75
    monkeypatch.setenv("LLM_SERVING_FRONTEND_KEEP_ALIVE_S", "9")
    assert frontend_main.main([]) == 0
    assert served["timeout_keep_alive"] == 9
