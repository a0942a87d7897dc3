"""The tritonserver command line: the stand-in parses it as tritonserver does, so a flag the
entrypoint misspells or drops fails here, not first in the image."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runtime.entrypoint import EntrypointSettings, ExitCode
from runtime.entrypoint.runner import triton_command
from tests.runtime.pod import Pod
from tests.runtime.test_entrypoint_failures import failure_line
from tests.support.triton_flags import POD_FLAGS, FlagError, check_pod_flags, parse_triton_flags


def _command(**settings: object) -> list[str]:
    argv = triton_command(EntrypointSettings(**settings), Path("/repo"), "toy")
    assert argv[0] == "tritonserver"
    return argv[1:]


@pytest.mark.parametrize("settings", [{}, {"drain_seconds": 0}], ids=["default", "drain-0"])
def test_the_entrypoint_command_is_one_tritonserver_accepts(settings: dict[str, object]) -> None:
    given = parse_triton_flags(_command(**settings))
    check_pod_flags(given)
    assert given["load-model"] == ["toy"] and given["model-control-mode"] == ["explicit"]
    # Triton binds the public gRPC port itself, which it does once the model has loaded.
    assert given["grpc-address"] == ["0.0.0.0"] and given["grpc-port"] == ["8001"]


@pytest.mark.parametrize("flag", sorted(POD_FLAGS))
def test_every_flag_the_pod_relies_on_is_required(flag: str) -> None:
    argv = [word for word in _command() if not word.startswith(f"--{flag}=")]
    with pytest.raises(FlagError, match=f"must pass --{flag}"):
        check_pod_flags(parse_triton_flags(argv))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strict-readyness=true"], "unrecognized option '--strict-readyness=true'"),
        (["--strict-read=true"], "unrecognized option"),  # no abbreviations
        (["--strict-readiness=maybe"], "invalid value for bool option: maybe"),
        (["--grpc-port=80x1"], 'Bad option: "--grpc-port".\nInvalid option value. Got 80x1'),
        (["--model-control-mode=polling"], "invalid argument for --model-control-mode"),
        (["--grpc-port"], "option '--grpc-port' requires an argument"),
        (["--disable-auto-complete-config=1"], "doesn't allow an argument"),
        (["models"], "Unexpected argument: models"),
    ],
)
def test_a_bad_command_line_is_refused_like_tritonserver(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError) as raised:
        parse_triton_flags(argv)
    assert message in str(raised.value)


def test_real_flags_the_stand_in_ignores_are_accepted() -> None:
    argv = ["--model-repository", "/m", "--log-verbose=1", "--backend-config=vllm,a=b"]
    argv += ["--disable-auto-complete-config", "--metrics-config=summary_latencies=true"]
    given = parse_triton_flags(argv)
    assert given["model-repository"] == ["/m"] and given["log-verbose"] == ["1"]


def test_a_misspelled_flag_makes_the_stand_in_exit_and_the_pod_fail(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    standin = f"{sys.executable} -m tests.runtime.slow_standin --strict-readyness=true"
    pod.env["LLM_SERVING_TRITONSERVER"] = standin
    code, err = pod.run_to_exit()
    assert code == ExitCode.STAGE_GATE, err
    assert "tritonserver: unrecognized option '--strict-readyness=true'" in err
    assert "exited with 1 before the model toy was ready" in failure_line(err)
