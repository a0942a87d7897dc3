"""Run the real entrypoint as a process against the tritonserver stand-in, on free ports.

The entrypoint's stage, failure and timing tests use it: they need a load time, a readiness
change or a failure at a chosen moment, and a start in milliseconds, not a minute per pod. The
pod on real Triton and the real engine (start, drain, disconnects, a model that fails to load,
embedded and standalone) is ``tests/runtime/real_pod.py`` with ``test_pod_real_triton.py``.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import psutil
import tritonclient.grpc as grpcclient

from runtime.package import build_package
from runtime.package.build import file_entry
from runtime.package.manifest import ARCHIVE_NAME, MANIFEST_NAME, Plugin, load_manifest
from runtime.package.wheels import read_wheel
from tests.runtime.wheelmaker import make_source
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
#: Environment variable naming the pod (its root folder) in every process it starts.
POD_MARKER = "POD_TEST_ROOT"
LIGHT_MATRIX = """
format_version = 1
default_triton = "26.08"

[[pairs]]
triton = "26.08"
vllm = "0.27.1"
structured_outputs_key = "structured_outputs"
python = "3.12"
backend_modules = ["json"]
response_hook = "utils.request:GenerateRequest.create_response"
"""


def port_refuses(port: int) -> bool:
    """True when nothing listens on ``127.0.0.1:port`` (the connection is refused).

    A connection reset before the connect returns is no answer: the listener closed meanwhile
    and reset what was in its backlog (as a port probed while it closes does), so it is asked
    again. The timeout is only a hang guard.
    """
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10):
                return False
        except ConnectionRefusedError:
            return True
        except ConnectionResetError:
            continue
    raise AssertionError(f"every connection to port {port} was reset")


def wait_for_file(path: Path, timeout: float = 60) -> bool:
    """Poll until ``path`` exists (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


#: Starts the entrypoint as a child subreaper (``PR_SET_CHILD_SUBREAPER``, kept across exec):
#: the orphans of its descendants become its children, as they are PID 1's in a container.
AS_REAPER = (
    "import ctypes, os, sys; "
    "assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0; "
    "os.execv(sys.executable, [sys.executable, '-m', 'runtime.entrypoint'])"
)


def http_status(port: int, path: str) -> int | None:
    """The status of ``GET path``, ``None`` while nothing answers (the timeout is a hang guard:
    on a loaded machine a busy server may take seconds)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def http_body(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def model_ready(port: int, model: str = "toy") -> bool:
    """Whether the KServe server behind ``port`` says the model is ready (``ModelReady``)."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        return bool(client.is_model_ready(model, client_timeout=10))
    finally:
        client.close()


def infer(port: int, prompt: str, max_tokens: int = 8, model: str = "toy") -> str:
    """One unary KServe request through ``port``; returns ``text_output``."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
        params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        params.set_data_from_numpy(
            np.array([f'{{"max_tokens": {max_tokens}}}'.encode()], dtype=object)
        )
        result = client.infer(model, [text, params], client_timeout=60)
        return b"".join(result.as_numpy("text_output").tolist()).decode()
    finally:
        client.close()


class StderrLog:
    """A process's stderr, read line by line on a thread for as long as the process writes it.

    A reader thread, not ``communicate()``: lines a test waited for and lines logged after them
    both end up in one text, and a chatty process never blocks on a full pipe.
    """

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._ended = False
        self._changed = threading.Condition()

    def follow(self, stream: IO[str]) -> None:
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                self._lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float) -> bool:
        """Whether a line containing ``text`` arrives within ``timeout`` (False at its end)."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._ended or any(text in line for line in self._lines), timeout
            )
            return any(text in line for line in self._lines)

    def text(self, timeout: float = 30) -> str:
        """Everything read so far, after waiting up to ``timeout`` for the stream's end."""
        with self._changed:
            self._changed.wait_for(lambda: self._ended, timeout)
            return "".join(self._lines)


@dataclass
class Pod:
    """A built package and the environment of one entrypoint run."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[str] | None = None
    log: StderrLog = field(default_factory=StderrLog)
    #: Process groups seen holding a marked process of this pod (see `leftover_processes`).
    groups: set[int] = field(default_factory=set)
    #: Whether the entrypoint reaps orphans as PID 1 does (see `AS_REAPER`).
    as_reaper: bool = False

    @classmethod
    def create(cls, root: Path, *, light_matrix: bool = True, source: Path | None = None) -> Pod:
        source = source or make_source(root / "src")
        build_package(source, root / "version")
        (root / "prom").mkdir()
        matrix = root / "compat.toml"
        matrix.write_text(LIGHT_MATRIX)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_SERVING_", "KSERVE_"))}
        env.update(
            {
                "PYTHONPATH": str(ROOT),
                "LLM_SERVING_PACKAGE_PATH": str(root / "version"),
                "LLM_SERVING_WORK_DIR": str(root / "work"),
                "LLM_SERVING_PLUGIN_DIR": str(root / "plugins"),
                "PROMETHEUS_MULTIPROC_DIR": str(root / "prom"),
                "LLM_SERVING_TRITON_RELEASE": "26.08",
                "LLM_SERVING_TRITONSERVER": f"{sys.executable} -m tests.runtime.slow_standin",
                "LLM_SERVING_PUBLIC_HOST": "127.0.0.1",
                "LLM_SERVING_HEALTH_HOST": "127.0.0.1",
                "LLM_SERVING_PUBLIC_GRPC_PORT": str(free_port()),
                "LLM_SERVING_TRITON_HTTP_PORT": str(free_port()),
                "LLM_SERVING_TRITON_METRICS_PORT": str(free_port()),
                "LLM_SERVING_HEALTH_PORT": str(free_port()),
                "LLM_SERVING_READY_TIMEOUT_SECONDS": "60",
                "LLM_SERVING_DRAIN_SECONDS": "10",
                # Inherited by everything the pod starts (Triton's stubs, vLLM's engine cores):
                # how leftover_processes finds them once their parents are gone.
                POD_MARKER: str(root),
                "KSERVE_STANDIN_LOAD_SECONDS": "0",
                # The stand-in refuses a command line that lacks what the pod relies on.
                "KSERVE_STANDIN_REQUIRE_POD_FLAGS": "1",
            }
        )
        env.pop("PIP_CONSTRAINT", None)
        if light_matrix:
            env["LLM_SERVING_COMPAT_MATRIX"] = str(matrix)
        return cls(root=root, env=env)

    def add_plugin(self, wheel: Path, entry_points: dict[str, list[str]] | None = None) -> None:
        """Add ``wheel`` to the built package as a packager without today's checks would:
        appended to the archive, listed in the manifest (with ``entry_points`` if given, else
        what the wheel declares), the archive entry resealed."""
        version = self.root / "version"
        manifest = load_manifest(version / MANIFEST_NAME)
        member = f"plugins/{wheel.name}"
        archive = version / ARCHIVE_NAME
        with tarfile.open(archive, "a") as tar:
            tar.add(wheel, arcname=member)
        info = read_wheel(wheel, member)
        plugin = Plugin(
            wheel=member,
            distribution=info.distribution,
            version=info.version,
            entry_points=info.entry_points if entry_points is None else entry_points,
        )
        sealed = manifest.model_copy(
            update={
                "plugins": [*manifest.plugins, plugin],
                "archive_files": [*manifest.archive_files, file_entry(wheel, member)],
                "archive": file_entry(archive, ARCHIVE_NAME),
            }
        )
        (version / MANIFEST_NAME).write_text(sealed.to_json())

    def hold_pip(self) -> tuple[Path, Path]:
        """Make stage 3's pip wait (``tests/runtime/pip_hold``): the file it creates once held,
        and the file that lets it go on."""
        held, release = self.root / "pip-held", self.root / "pip-release"
        hook = Path(__file__).parent / "pip_hold"
        self.env["PYTHONPATH"] = os.pathsep.join([str(hook), self.env["PYTHONPATH"]])
        self.env["POD_TEST_PIP_HELD"], self.env["POD_TEST_PIP_RELEASE"] = str(held), str(release)
        return held, release

    def port(self, name: str) -> int:
        return int(self.env[f"LLM_SERVING_{name.upper()}_PORT"])

    def start(self) -> Pod:
        command = ["-c", AS_REAPER] if self.as_reaper else ["-m", "runtime.entrypoint"]
        self.process = subprocess.Popen(
            [sys.executable, *command],
            env=self.env,
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stderr is not None
        self.log.follow(self.process.stderr)
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while http_status(self.port("health"), "/readyz") != 200:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(
                    f"entrypoint exited {self.process.returncode}: {self.stderr()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError("entrypoint not ready in time")
            time.sleep(0.05)

    def run_to_exit(self, timeout: float = 90) -> tuple[int, str]:
        return self.start().wait_exit(timeout)

    def wait_exit(self, timeout: float = 90) -> tuple[int, str]:
        """Wait for the entrypoint to exit by itself; its exit code and whole stderr."""
        assert self.process is not None
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.terminate()  # it stops its own children; a killed one could not
            self.process.wait(timeout=60)
            raise
        return code, self.log.text()

    def wait_for_line(self, text: str, timeout: float = 120) -> None:
        """Wait until the entrypoint logs a line containing ``text``."""
        if not self.log.wait_for(text, timeout):
            raise AssertionError(f"the entrypoint never logged {text!r}: {self.log.text(0)}")

    def terminate(self, timeout: float = 60) -> tuple[int, str]:
        assert self.process is not None
        self.remember_groups()
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout), self.log.text()

    def stop_if_running(self) -> None:
        """Stop the entrypoint if a test left it running, then kill whatever of the pod is left.

        A real Triton can take longer than the wait here to finalize its model, and killing
        the entrypoint then would leave Triton's stubs and vLLM's engine cores (1.7 GB each)
        running under the tests that follow.
        """
        if self.process is None:
            return
        self.remember_groups()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        left = self.leftover_processes(timeout=0)
        groups = set()
        for process in left:
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(process.pid))
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        # What joined their groups since the scan (an engine core starting its worker) ends too.
        for group in groups - {os.getpgrp()}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)

    def remember_groups(self) -> None:
        """Note the process groups of the pod's servers while they run: once a server has
        gone, its group is what still finds the engine processes it leaves behind."""
        self.leftover_processes(timeout=0)

    def leftover_processes(self, timeout: float = 5) -> list[psutil.Process]:
        """Processes of this pod other than the entrypoint still running after ``timeout``
        seconds (SIGKILLed ones take a moment to go).

        A process is the pod's if its environment carries the marker, or if it is in a process
        group where one that does was seen: vLLM's engine processes write their title
        (``VLLM::EngineCore``) over their environment, and only their group, which the
        entrypoint gives each server it starts, still shows whose they are.
        """
        entrypoint = self.process.pid if self.process is not None else None
        deadline = time.monotonic() + timeout
        while True:
            marked: list[psutil.Process] = []
            unmarked: list[tuple[psutil.Process, int]] = []
            for process in psutil.process_iter():
                try:
                    if process.pid == entrypoint or process.status() == psutil.STATUS_ZOMBIE:
                        continue
                    group = os.getpgid(process.pid)
                    is_marked = process.environ().get(POD_MARKER) == str(self.root)
                except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                    continue
                if not is_marked:
                    unmarked.append((process, group))
                    continue
                marked.append(process)
                # The entrypoint runs in the tests' own group, which is never the pod's.
                if group != os.getpgrp():
                    self.groups.add(group)
            found = marked + [p for p, group in unmarked if group in self.groups]
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.1)

    def leftover_servers(self) -> list[psutil.Process]:
        """The pod's processes still running with its Triton HTTP port in their argv."""
        flag = f"--http-port={self.port('triton_http')}"
        found = []
        for process in self.leftover_processes(timeout=0):
            with contextlib.suppress(psutil.NoSuchProcess):
                if flag in process.cmdline():
                    found.append(process)
        return found

    def stderr(self) -> str:
        """The entrypoint's whole stderr, killing it first if it still runs."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        return self.log.text()
