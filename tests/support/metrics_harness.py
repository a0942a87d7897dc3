"""Processes for metrics-proxy tests and benchmarks: vLLM-like writers and the proxy itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.ports import free_port

__all__ = ["ProxyProcess", "WriterProcesses"]

_REPO = Path(__file__).resolve().parents[2]


class WriterProcesses:
    """``count`` separate processes running ``tests.support.vllm_metrics_writer``."""

    def __init__(self, directory: Path, count: int) -> None:
        self.directory = directory
        self.count = count
        self.ticks = 0
        self.processes: list[subprocess.Popen[str]] = []

    def __enter__(self) -> WriterProcesses:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.directory)}
        for index in range(self.count):
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.vllm_metrics_writer", "--index", str(index)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=_REPO,
            )
            self.processes.append(proc)
        for proc in self.processes:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", "writer failed to start"
        return self

    def tick(self) -> None:
        """Every live writer applies its next round; returns when all have written it."""
        live = [p for p in self.processes if p.poll() is None]
        for proc in live:
            assert proc.stdin is not None
            proc.stdin.write("tick\n")
            proc.stdin.flush()
        for proc in live:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ok"
        self.ticks += 1

    def kill(self, index: int) -> int:
        """SIGKILL one writer (no cleanup, as a crash); return its pid."""
        proc = self.processes[index]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return proc.pid

    def __exit__(self, *exc: object) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                assert proc.stdin is not None
                proc.stdin.write("exit\n")
                proc.stdin.close()
        for proc in self.processes:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class ProxyProcess:
    """``python -m runtime.metrics_proxy`` on a free loopback port, configured by env.

    ``command`` replaces ``-m runtime.metrics_proxy`` (the benchmark's variant of the proxy).
    """

    def __init__(
        self,
        multiproc_dir: Path,
        triton_url: str,
        command: tuple[str, ...] = ("-m", "runtime.metrics_proxy"),
        **env: str,
    ) -> None:
        self.command = command
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir),
            "METRICS_PROXY_HOST": "127.0.0.1",
            "METRICS_PROXY_PORT": str(self.port),
            "METRICS_PROXY_TRITON_URL": triton_url,
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ProxyProcess:
        self.process = subprocess.Popen(
            [sys.executable, *self.command],
            env=self.env,
            cwd=_REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"proxy exited: {self.process.stderr.read().decode()}")  # type: ignore[union-attr]
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("proxy did not answer /healthz within 30 s")

    def stop(self, timeout_s: float = 10) -> int:
        """SIGTERM and wait; return the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.stop()
            if self.process.stderr is not None:
                self.process.stderr.close()
