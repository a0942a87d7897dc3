"""How the entrypoint names a child's end, and the open-files limit it starts with."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys

import pytest

from runtime.entrypoint.runner import _how_it_ended


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (0, "exited with 0"),
        (3, "exited with 3"),
        (-signal.SIGKILL, "was killed by SIGKILL"),
        # Real-time signals between SIGRTMIN and SIGRTMAX are no member of signal.Signals.
        (-(signal.SIGRTMIN + 6), f"was killed by signal {signal.SIGRTMIN + 6}"),
    ],
)
def test_a_childs_end_is_named_for_every_signal(code: int, said: str) -> None:
    assert _how_it_ended(code) == said


def test_the_entrypoint_takes_the_hard_open_files_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard > 256, "this machine's hard limit leaves nothing to raise"
    script = (
        "import resource; from runtime.entrypoint.__main__ import raise_open_files_limit; "
        "raise_open_files_limit(); print(*resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    out = subprocess.run(
        ["bash", "-c", f'ulimit -Sn 256; exec "{sys.executable}" -c "$0"', script],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out.split() == [str(hard), str(hard)]
