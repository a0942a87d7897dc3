"""The entrypoint as the container's PID 1 reaps the orphans its servers leave: a process whose
parent died (an engine core's helper) is reparented to PID 1, and one never reaped stays a
zombie holding a pid of the pod's limit. The entrypoint runs as a child subreaper here, which
gets the orphans of its descendants as PID 1 does."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from tests.runtime.pod import Pod, wait_for_file


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_an_orphan_of_the_server_is_reaped_while_serving(tmp_path: Path) -> None:
    pod = Pod.create(tmp_path)
    pod.as_reaper = True
    orphan = tmp_path / "orphan.pid"
    pod.env["STANDIN_ORPHAN_PID_FILE"] = str(orphan)
    pod.start()
    assert wait_for_file(orphan), pod.stderr()
    pid = int(orphan.read_text())
    assert pod.process is not None
    # It lives 3 s after its parent exits: long enough to see whose it became.
    assert psutil.Process(pid).ppid() == pod.process.pid, "not reparented to the entrypoint"
    pod.wait_ready()
    deadline = time.monotonic() + 15
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _zombie(pid), "the orphan was left a zombie"
    code, err = pod.terminate()
    assert code == 0, err
