"""``python -m runtime.entrypoint`` as a process: ``--help``, stray arguments, and the one line
that names the variables to set when a setting is bad or no package is configured."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.entrypoint.errors import ExitCode
from runtime.entrypoint.settings import EntrypointSettings
from tests.runtime.pod import Pod
from tests.support.programs import check_help, check_refused_arguments


def test_help_describes_the_program_and_every_variable_it_reads() -> None:
    stderr = check_help(
        "runtime.entrypoint",
        EntrypointSettings,
        "locate and verify the model package",
        "  LLM_SERVING_PACKAGE_PATH (default: unset)\n",
        "  LLM_SERVING_PUBLIC_GRPC_PORT (default: 8001)\n",
        "  PROMETHEUS_MULTIPROC_DIR (default: unset)\n",
        "SIGTERM drain deadline",
    )
    assert "stage 1/8" not in stderr  # nothing was started


@pytest.mark.parametrize("args", [("--serve",), ("extra",)])
def test_any_other_argument_exits_2_with_the_usage_line(args: tuple[str, ...]) -> None:
    assert "stage 1/8" not in check_refused_arguments("runtime.entrypoint", *args)


def test_bad_settings_are_one_line_naming_each_variable(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.env["LLM_SERVING_PUBLIC_GRPC_PORT"] = "abc"
    pod.env["LLM_SERVING_DRAIN_SECONDS"] = "inf"
    code, err = pod.run_to_exit()
    assert code == ExitCode.CONFIG, err
    (line,) = err.splitlines()
    assert line.startswith("llm-serving entrypoint: invalid setting LLM_SERVING_PUBLIC_GRPC_PORT: ")
    assert "valid integer" in line and "(got 'abc')" in line
    assert "; LLM_SERVING_DRAIN_SECONDS: " in line and "(got 'inf')" in line


@pytest.mark.parametrize(
    "partial", [{}, {"LLM_SERVING_MODEL_ID": "toy"}], ids=["nothing", "id-without-version"]
)
def test_no_package_configured_names_the_variables_to_set(
    tmp_path: Path, partial: dict[str, str]
) -> None:
    pod = Pod.create(tmp_path)
    del pod.env["LLM_SERVING_PACKAGE_PATH"]
    pod.env.update(partial)
    code, err = pod.run_to_exit()
    assert code == ExitCode.STAGE_LOCATE, err
    lines = [line for line in err.splitlines() if " failed: " in line]
    assert len(lines) == 1, err
    assert lines[0].startswith(
        "llm-serving entrypoint: stage 1/8 locate failed: no model package is configured "
    )
    assert "None" not in lines[0]
    assert "set LLM_SERVING_PACKAGE_PATH" in lines[0]
    assert "LLM_SERVING_MODEL_ID and LLM_SERVING_MODEL_VERSION" in lines[0]
