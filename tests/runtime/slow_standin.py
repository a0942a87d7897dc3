"""The KServe ``tritonserver`` stand-in (tests/support) with test knobs from the environment:
a per-token delay (``STANDIN_TOKEN_DELAY_SECONDS``), so tests can have requests in flight at
SIGTERM; a hold (``STANDIN_HOLD_UNTIL_FILE``: each generation, once its request is recorded,
waits until that file exists), so a test decides when in-flight requests may finish; and a
readiness switch (``STANDIN_UNREADY_WHILE_FILE``: not ready while that file exists) to model a
backend health check failing for a while; and a helper process (``STANDIN_HELPER_PID_FILE``: its
pid is written there) that ignores SIGTERM and outlives the server, as a hung backend stub or a
vLLM engine core does when Triton is killed; and an orphan (``STANDIN_ORPHAN_PID_FILE``: its pid
is written there), a process whose parent exits at once, which then lives 3 s, as a helper
of a crashed engine core does. A test helper only; never imported by product code."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.support import kserve_server

_init = kserve_server.KServeStandIn.__init__


def _slow_init(self: kserve_server.KServeStandIn, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault("token_delay_s", float(os.environ.get("STANDIN_TOKEN_DELAY_SECONDS", "0")))
    _init(self, *args, **kwargs)


_generate = kserve_server.KServeStandIn._generate


async def _held_generate(
    self: kserve_server.KServeStandIn, *args: Any, **kwargs: Any
) -> AsyncIterator[Any]:
    hold = os.environ.get("STANDIN_HOLD_UNTIL_FILE")
    while hold and not Path(hold).exists():
        await asyncio.sleep(0.02)
    async for response in _generate(self, *args, **kwargs):
        yield response


_ready = kserve_server.KServeStandIn.ready.fget
assert _ready is not None


def _switched_ready(self: kserve_server.KServeStandIn) -> bool:
    # Like a backend health check that fails for a while once loaded: the test decides when.
    unready = os.environ.get("STANDIN_UNREADY_WHILE_FILE")
    return bool(_ready(self)) and not (unready and Path(unready).exists())


def _start_helper(pid_file: str) -> None:
    # In the server's process group, like the stubs Triton forks; reparented once it dies.
    helper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
        ]
    )
    Path(pid_file).write_text(str(helper.pid))


def _start_orphan(pid_file: str) -> None:
    # The middle process starts the orphan and exits: the orphan goes to the nearest reaper.
    orphan = "import time; time.sleep(3)"
    middle = (
        "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', "
        f"{orphan!r}], stdout=subprocess.DEVNULL).pid)"
    )
    pid = subprocess.run([sys.executable, "-c", middle], capture_output=True, text=True).stdout
    Path(pid_file).write_text(pid.strip())


if __name__ == "__main__":
    if orphan_pid_file := os.environ.get("STANDIN_ORPHAN_PID_FILE"):
        _start_orphan(orphan_pid_file)
    if helper_pid_file := os.environ.get("STANDIN_HELPER_PID_FILE"):
        _start_helper(helper_pid_file)
    kserve_server.KServeStandIn.__init__ = _slow_init  # type: ignore[method-assign]
    kserve_server.KServeStandIn._generate = _held_generate  # type: ignore[method-assign]
    kserve_server.KServeStandIn.ready = property(_switched_ready)  # type: ignore[method-assign,assignment]
    sys.exit(kserve_server.main())
