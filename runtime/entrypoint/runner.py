"""The start-up sequence, the serving loop and the SIGTERM drain (``python -m runtime.entrypoint``).

Stages, each timed (a log line and ``startup_stage_seconds{stage}``), each failure one line on
stderr naming the stage and the fix, exit code ``10 + stage number``: 1 locate, 2 unpack,
3 plugins, 4 metrics, 5 compat, 6 render, 7 start, 8 gate. Other exit codes: `ExitCode`.
SIGTERM before the gate opens cancels the start once the running stage ends (exit 0); after,
it drains.

Over 400 lines on purpose: start-up, serving and drain are one state machine over the same
children and signals; the stages' own work lives in :mod:`runtime.entrypoint.stages`.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from runtime.compat import CompatError
from runtime.constraints.catalog import CATALOG_DIR_ENV
from runtime.entrypoint.errors import STAGES, ExitCode, StageFailed
from runtime.entrypoint.health import HealthServer
from runtime.entrypoint.plugins import install_plugins, scan_image
from runtime.entrypoint.render import link_catalogs, render_repository, vllm_backend_for
from runtime.entrypoint.settings import EntrypointSettings
from runtime.entrypoint.stages import (
    check_compat,
    locate,
    release_pair,
    start_import_probe,
    unpack,
    wipe_multiproc_dir,
)
from runtime.package.errors import PackageError
from runtime.package.manifest import LLM_BACKENDS, Manifest

__all__ = ["Entrypoint", "exit_timeout_secs", "log", "triton_command"]

T = TypeVar("T")
#: Seconds between two sweeps for orphans to reap (each holds a pid of the pod's limit).
_REAP_SECONDS = 1.0
_FIXES = {
    "locate": "republish the version or re-run the model cache restore Job",
    "unpack": "rebuild and republish the package (llm-serving package build)",
    "plugins": "rebuild the plugin wheels against the image's pinned versions",
    "metrics": "mount a writable emptyDir at PROMETHEUS_MULTIPROC_DIR",
    "compat": "use the serving image built for this Triton/vLLM pair",
    "render": "check LLM_SERVING_WORK_DIR is writable local disk",
    "start": "check LLM_SERVING_TRITONSERVER and the ports",
    "gate": "read Triton's log above; raise LLM_SERVING_READY_TIMEOUT_SECONDS for slow loads",
}


def log(message: str) -> None:
    """One line on stderr, prefixed so it stands out in Triton's interleaved log."""
    print(f"llm-serving entrypoint: {message}", file=sys.stderr, flush=True)


class _StageMetrics:
    """Stage timings; the gauge is created only after stage 4 wiped the multiprocess folder."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._gauge: Any = None
        self._registry: Any = None

    def record(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = seconds
        if self._gauge is not None:
            self._gauge.labels(stage=stage).set(seconds)

    def enable(self) -> None:
        from prometheus_client import CollectorRegistry, Gauge

        self._registry = CollectorRegistry()
        self._gauge = Gauge(
            "startup_stage_seconds",
            "Seconds each entrypoint start-up stage took",
            ["stage"],
            registry=self._registry,
            multiprocess_mode="mostrecent",
        )
        for stage, seconds in self.seconds.items():
            self._gauge.labels(stage=stage).set(seconds)

    def render(self) -> bytes:
        if self._registry is None:
            return b""
        from prometheus_client import generate_latest

        return generate_latest(self._registry)


@dataclass(frozen=True)
class _Stop:
    """How one server stopped: seconds from its SIGTERM to its exit, and whether it outlived
    the wait and was killed."""

    process: asyncio.subprocess.Process
    seconds: float
    killed: bool


@dataclass
class _State:
    live: bool = True
    ready: bool = False
    draining: bool = False
    processes: list[asyncio.subprocess.Process] = field(default_factory=list)


class Entrypoint:
    """One run of the serving pod's main process."""

    def __init__(self, settings: EntrypointSettings) -> None:
        self.settings = settings
        self.metrics = _StageMetrics()
        self.state = _State()
        self.stop = asyncio.Event()
        self._probe: subprocess.Popen[str] | None = None
        self._embedded = False
        self._reaper: asyncio.Future[None] | None = None

    async def _stage(self, number: int, work: Awaitable[T]) -> T:
        """Run stage ``number``: time and log it, and turn whatever it raises into its failure."""
        name = STAGES[number - 1]
        started = time.perf_counter()
        try:
            result = await work
        except (_Failed, _Stopped):
            raise
        except StageFailed as exc:
            raise _Failed(number, str(exc), exc.fix) from exc
        except (PackageError, CompatError, OSError) as exc:
            raise _Failed(number, str(exc), _FIXES[name]) from exc
        except Exception as exc:  # a bug or an unforeseen input: still one line, exit 10 + n
            raise _Failed(number, _unexpected(exc), _FIXES[name]) from exc
        seconds = time.perf_counter() - started
        self.metrics.record(name, seconds)
        log(f"stage {number}/8 {name} done in {seconds:.3f}s")
        # A stage is not interrupted (pip or a checksum half done helps nobody), but no stage
        # starts after SIGTERM; once the gate is open, serving sees the stop at once.
        if self.stop.is_set() and number < len(STAGES):
            raise _Stopped(number, during=False)
        return result

    async def run(self) -> int:
        """Start up, serve until SIGTERM or a server exits, return the exit code (`ExitCode`).

        Every way out, unexpected exceptions included, passes one ``finally`` that stops the
        child processes started so far and closes every port: nothing is left running.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        health = HealthServer(
            self.settings.health_host,
            self.settings.health_port,
            live=lambda: self.state.live,
            ready=lambda: self.state.ready and not self.state.draining,
            metrics=self.metrics.render,
        )
        try:
            try:
                await health.start()
            except OSError as exc:
                log(
                    f"health port failed: cannot bind {self.settings.health_host}:"
                    f"{self.settings.health_port} ({exc}); fix: free the port or set "
                    "LLM_SERVING_HEALTH_PORT"
                )
                return ExitCode.CONFIG
            return await self._stages()
        except _Failed as failed:
            name = STAGES[failed.number - 1]
            log(f"stage {failed.number}/8 {name} failed: {failed.message}; fix: {failed.fix}")
            return 10 + failed.number
        except _Stopped as stopped:
            return await self._cancel_start(stopped)
        except Exception as exc:  # outside any stage (serving, draining): a bug, still one line
            log(f"internal error: {_unexpected(exc)}; the servers were stopped")
            return ExitCode.INTERNAL
        finally:
            self._kill_probe()
            await self._stop_processes(0)
            if self._reaper is not None:
                self._reaper.cancel()
            health.close()

    def _kill_probe(self) -> None:
        if self._probe is not None and self._probe.returncode is None:
            self._probe.kill()
            self._probe.communicate()

    async def _stages(self) -> int:
        s = self.settings
        work = s.work_dir
        # vLLM's import takes seconds: the probe runs while stages 1-4 do. It sees the image
        # as it is, without the plugin folder (still holding an earlier start's plugins until
        # stage 3 empties it); stage 3 refuses any plugin file that would shadow an installed
        # package, so with the plugins first on the path vLLM's modules resolve the same.
        self._probe = start_import_probe(s.triton_release, s.compat_matrix)
        # Stage 3's shadowing check reads every installed RECORD (about a second): meanwhile.
        scan = asyncio.ensure_future(asyncio.to_thread(scan_image, s.plugin_dir, work / "package"))
        folder, manifest = await self._stage(
            1,
            asyncio.to_thread(
                locate,
                s.version_folder(),
                s.package_s3_uri,
                work / "download",
                verify_weights=s.verify_weights,
                expect=(s.model_id, s.model_version),
                warn=lambda m: log(f"warning: {m}"),
            ),
        )
        unpacked = await self._stage(
            2, asyncio.to_thread(unpack, folder, manifest, work / "package", s.max_unpack_bytes)
        )

        async def plugins() -> list[str]:
            image = await scan if manifest.plugins else None
            return await asyncio.to_thread(
                install_plugins, manifest, unpacked, s.plugin_dir, s.constraints_file, image
            )

        entry_points = await self._stage(3, plugins())
        if entry_points:
            log(f"plugins registered: {', '.join(entry_points)}")
        removed = await self._stage(4, asyncio.to_thread(wipe_multiproc_dir, s.multiproc_dir))
        log(f"removed {removed} stale entries from PROMETHEUS_MULTIPROC_DIR")
        self.metrics.enable()
        if manifest.backend in LLM_BACKENDS:
            compat = (s.triton_release, s.compat_matrix, self._probe, self._python_env())
            pair = await self._stage(5, asyncio.to_thread(check_compat, *compat))
            log(f"compatible: Triton {pair.triton} / vLLM {pair.vllm}")
        else:
            self._kill_probe()  # no vLLM runs: its import cost and verdict do not matter
            release = (s.triton_release, s.compat_matrix)
            pair = await self._stage(5, asyncio.to_thread(release_pair, *release))
            log(f"Triton {pair.triton}: backend {manifest.backend} runs no vLLM, none checked")
        repository = work / "model_repository"

        def render() -> Path:
            backend, fallback = vllm_backend_for(pair)
            if fallback is not None and manifest.backend == "vllm":
                log(f"warning: {fallback}")
            render_repository(
                manifest,
                folder,
                unpacked,
                repository,
                s.logits_processor,
                backend,
                s.plugin_dir,
                structured_outputs=pair.structured_outputs_key == "structured_outputs",
                kind_setting=s.instance_kind,
            )
            return link_catalogs(manifest, unpacked, work / "catalogs")

        catalogs = await self._stage(6, asyncio.to_thread(render))
        embedded = self._embedded = (s.serving_mode or manifest.serving_mode) == "embedded"
        await self._stage(7, self._start(manifest, repository, unpacked, catalogs, embedded))
        # Only now: from here on the servers are the entrypoint's only children of its own, so
        # any other exited child is an orphan and no one else's exit status is taken.
        self._reaper = asyncio.ensure_future(self._reap_orphans())
        await self._stage(8, self._open_gate(manifest, embedded))
        return await self._serve(manifest)

    def _python_env(self) -> dict[str, str]:
        """The environment of Triton's Python (and the import probe): plugin folder first."""
        env = dict(os.environ)
        if self.settings.plugin_dir is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(self.settings.plugin_dir), env.get("PYTHONPATH", "")) if p
            )
        return env

    def _child_env(self, catalogs: Path) -> dict[str, str]:
        env = self._python_env()
        # The constraint processor (in Triton's vLLM) and the frontend's constraint validation
        # both find the package's catalogs here by name.
        env[CATALOG_DIR_ENV] = str(catalogs)
        return env

    async def _start(
        self, manifest: Manifest, repository: Path, unpacked: Path, catalogs: Path, embedded: bool
    ) -> None:
        s = self.settings
        if embedded and manifest.backend not in LLM_BACKENDS:
            raise _Failed(
                7,
                f"embedded mode puts the OpenAI frontend in front of an LLM; model "
                f"{manifest.model_id} is a {manifest.backend} model, served over gRPC only",
                "unset LLM_SERVING_SERVING_MODE or set it to standalone",
            )
        if embedded and manifest.max_model_len is None:
            # The frontend's context limit; its own default would not be this model's.
            raise _Failed(
                7,
                f"embedded mode needs engine_args.max_model_len, which model {manifest.model_id} "
                "does not set",
                "repackage with engine_args.max_model_len, or set "
                "LLM_SERVING_SERVING_MODE=standalone",
            )
        _check_port_free(s.public_host, s.public_grpc_port)
        argv = triton_command(s, repository, manifest.model_id)
        env = self._child_env(catalogs)
        triton = await self._spawn(argv, env, argv[0])
        log(f"started {argv[0]} (pid {triton.pid}), gRPC on {s.public_host}:{s.public_grpc_port}")
        if embedded:
            assert manifest.tokenizer is not None  # every LLM backend has one, checked above
            env.update(
                {
                    # Triton's own public port, reached on loopback: no hop in between.
                    "LLM_SERVING_FRONTEND_TRITON_URL": s.public_grpc_url(),
                    "LLM_SERVING_FRONTEND_MODEL_NAME": manifest.model_id,
                    "LLM_SERVING_FRONTEND_TOKENIZER_DIR": str(unpacked / manifest.tokenizer),
                    "LLM_SERVING_FRONTEND_PORT": str(s.frontend_port),
                }
            )
            if s.triton_release:
                env["LLM_SERVING_FRONTEND_TRITON_RELEASE"] = s.triton_release
            env["LLM_SERVING_FRONTEND_MAX_MODEL_LEN"] = str(manifest.max_model_len)
            if manifest.max_logprobs is not None:
                env["LLM_SERVING_FRONTEND_MAX_LOGPROBS"] = str(manifest.max_logprobs)
            argv_frontend = s.frontend_argv()
            if argv_frontend[1:3] == ["-m", "runtime.frontend"] and not _has_module(
                "runtime.frontend"
            ):
                raise _Failed(
                    7,
                    "embedded mode needs the OpenAI frontend (runtime.frontend), which this "
                    "image does not have",
                    "build the image with the frontend or set serving_mode standalone",
                )
            frontend = await self._spawn(argv_frontend, env, "the frontend")
            log(f"embedded mode: OpenAI frontend (pid {frontend.pid}) on port {s.frontend_port}")

    async def _spawn(
        self, argv: list[str], env: dict[str, str], what: str
    ) -> asyncio.subprocess.Process:
        """Start ``argv`` as a child the shutdown will stop; ``what`` names it if it cannot run.

        Each server leads its own process group, which its helpers join (Triton's backend
        stubs and their vLLM engine cores), so that stopping it ends them too. The group stays
        in the entrypoint's session: a new session is a new scheduler autogroup, which changes
        how the kernel shares the CPUs between the servers (uvloop takes no ``process_group``).
        """
        try:
            process = await asyncio.create_subprocess_exec(*argv, env=env, preexec_fn=os.setpgrp)
        except OSError as exc:
            raise _Failed(7, f"cannot run {what}: {exc}", _FIXES["start"]) from exc
        self.state.processes.append(process)
        return process

    def _model_status(self, model: str) -> int | None:
        """Triton's answer to the model's readiness check, ``None`` while it does not answer."""
        conn = http.client.HTTPConnection("127.0.0.1", self.settings.triton_http_port, timeout=2)
        try:
            conn.request("GET", f"/v2/models/{model}/ready")
            return conn.getresponse().status
        except OSError:
            return None
        finally:
            conn.close()

    def _model_ready(self, model: str) -> bool:
        return self._model_status(model) == 200

    def _public_port_accepts(self) -> bool:
        try:
            with socket.create_connection(self.settings.public_grpc_target(), timeout=1):
                return True
        except OSError:
            return False

    def _frontend_ready(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.settings.frontend_port, timeout=2)
        try:
            conn.request("GET", "/health/ready")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def _exited(self) -> asyncio.subprocess.Process | None:
        return next((p for p in self.state.processes if p.returncode is not None), None)

    async def _open_gate(self, manifest: Manifest, embedded: bool) -> None:
        """Wait for the model (and in embedded mode the frontend) to be ready. Triton binds the
        public gRPC port only once its startup models have loaded, so the port was closed until
        now; this checks that it really was, and that it is open now."""
        deadline = time.monotonic() + self.settings.ready_timeout_seconds
        while True:
            exited = self._exited()
            if exited is not None:
                raise _Failed(
                    8,
                    f"process {exited.pid} exited with {exited.returncode} before the model "
                    f"{manifest.model_id} was ready",
                    _FIXES["gate"],
                )
            if self.stop.is_set():
                raise _Stopped(8, during=True)
            status = await asyncio.to_thread(self._model_status, manifest.model_id)
            ready = status == 200
            # Triton starts its endpoints only after the startup models have loaded, so a
            # server that answers "not ready" while the public port accepts binds early.
            if status not in (None, 200) and self._public_port_accepts():
                raise _Failed(
                    8,
                    f"the server accepts connections on the public gRPC port "
                    f"{self.settings.public_grpc_port} before model {manifest.model_id} is ready",
                    "set LLM_SERVING_TRITONSERVER to a tritonserver that binds its ports only "
                    "once the startup models have loaded (Triton does)",
                )
            if ready and embedded:
                ready = await asyncio.to_thread(self._frontend_ready)
            if ready:
                break
            if time.monotonic() > deadline:
                raise _Failed(
                    8,
                    f"model {manifest.model_id} not ready after "
                    f"{self.settings.ready_timeout_seconds:g}s",
                    _FIXES["gate"],
                )
            await asyncio.sleep(0.1)
        if not await asyncio.to_thread(self._public_port_accepts):
            raise _Failed(
                8,
                f"model {manifest.model_id} is ready but nothing listens on the public gRPC "
                f"port {self.settings.public_grpc_port}",
                _FIXES["gate"],
            )
        self.state.ready = True
        log(
            f"model {manifest.model_id} ready; public gRPC port {self.settings.public_grpc_port} "
            "open, served by Triton itself"
        )

    async def _watch_readiness(self, model: str) -> None:
        """Follow the model's readiness while serving, so /readyz stops routing to a sick model.

        The port stays open: streams in flight finish, and Triton itself answers new requests
        for an unready model with an error the client can retry elsewhere.
        """
        while True:
            await asyncio.sleep(self.settings.readiness_poll_seconds)
            ready = await asyncio.to_thread(self._model_ready, model)
            if ready != self.state.ready and not self.state.draining:
                log(f"model {model} is {'ready again' if ready else 'no longer ready'}")
                self.state.ready = ready

    async def _reap_orphans(self) -> None:
        """Reap, now and then, the exited children the entrypoint did not start: as the
        container's PID 1 it inherits every orphan of the pod (a helper of an engine core that
        died), and no one else reaps them. The servers' own exits are left to asyncio."""
        while True:
            await asyncio.sleep(_REAP_SECONDS)
            own = {process.pid for process in self.state.processes}
            for pid in _exited_children() - own:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)

    async def _serve(self, manifest: Manifest) -> int:
        waits = [asyncio.ensure_future(p.wait()) for p in self.state.processes]
        stop = asyncio.ensure_future(self.stop.wait())
        watch = asyncio.ensure_future(self._watch_readiness(manifest.model_id))
        try:
            done, _ = await asyncio.wait([stop, *waits], return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if stop not in done:
            exited = self._exited()
            assert exited is not None  # one of the waits finished
            log(
                f"{self._name(exited)} (pid {exited.pid}) {_how_it_ended(exited.returncode)} "
                f"while serving; stopping the others; fix: read its log above (killed by SIGKILL "
                "is often the out-of-memory killer: raise the container's memory limit)"
            )
            self.state.ready = False
            await self._stop_processes(self.settings.drain_seconds)
            return ExitCode.SERVER_EXITED
        return await self._drain()

    async def _drain(self) -> int:
        s = self.settings
        if self._embedded:
            # The frontend's in-flight requests need Triton: it stops first, and Triton, which
            # closes the public gRPC port on SIGTERM, after it. The pod has left the Service's
            # endpoints during the preStop sleep, so no new client is routed here meanwhile.
            log(
                f"SIGTERM: draining the frontend, then Triton (closing the public port), for up "
                f"to {s.drain_seconds:g}s each"
            )
        else:
            # Triton closes its gRPC listener first, then finishes the requests in flight.
            log(f"SIGTERM: closing the public port, draining for up to {s.drain_seconds:g}s")
        self.state.draining = True
        stops = await self._stop_processes(s.drain_seconds)
        budget = exit_timeout_secs(s)
        codes = [stop.process.returncode for stop in stops]
        # Each server has the whole deadline to itself (the frontend's requests must finish
        # before Triton may stop), so each stop is judged on its own: their sum may exceed it.
        # Triton gets the deadline as --exit-timeout-secs and cuts in-flight requests when it
        # passes, so a stop that took that long is not a clean drain either; the frontend's
        # budget is the same, in the same whole seconds.
        late = [stop for stop in stops if stop.killed or stop.seconds >= budget]
        if late:
            took = ", ".join(f"{self._name(stop.process)} {stop.seconds:.1f}s" for stop in late)
            log(
                f"drain deadline of {s.drain_seconds:g}s reached ({took}; exit codes {codes}); "
                "in-flight requests may have failed"
            )
            return ExitCode.DRAIN_TIMEOUT
        failed = [stop for stop in stops if stop.process.returncode != 0]
        if failed:
            what = ", ".join(
                f"process {stop.process.pid} {_how_it_ended(stop.process.returncode)} after "
                f"{stop.seconds:.1f}s"
                for stop in failed
            )
            log(
                f"drain failed: {what}, before the {s.drain_seconds:g}s deadline; in-flight "
                "requests may have failed"
            )
            return ExitCode.DRAIN_SERVER_EXITED
        log("drained: every in-flight request finished")
        return ExitCode.DRAINED

    async def _cancel_start(self, stopped: _Stopped) -> int:
        """SIGTERM before the gate opened: no request can be in flight, so stop what runs."""
        name = STAGES[stopped.number - 1]
        when = "during" if stopped.during else "after"
        log(f"SIGTERM {when} stage {stopped.number}/8 {name}: start cancelled, nothing to drain")
        stops = await self._stop_processes(self.settings.drain_seconds)
        if any(stop.killed for stop in stops):
            log(f"the servers did not stop within {self.settings.drain_seconds:g}s and were killed")
        return ExitCode.DRAINED

    async def _stop_processes(self, deadline: float) -> list[_Stop]:
        """SIGTERM every child (frontend first), wait ``deadline`` seconds, then SIGKILL; then
        SIGKILL what is left of its process group. Returns each stop, in that order, timed from
        its own SIGTERM."""
        stops = []
        for process in reversed(self.state.processes):
            started = time.monotonic()
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
            killed = False
            try:
                await asyncio.wait_for(process.wait(), timeout=deadline + 5)
            except TimeoutError:
                killed = True
            seconds = time.monotonic() - started
            # A killed Triton leaves its backend stubs and their engine cores running, holding
            # the model's memory (GPU memory on a GPU node), and so can a stub that hangs after
            # Triton exits: they are of no use without it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            stops.append(_Stop(process, seconds, killed))
        return stops

    def _name(self, process: asyncio.subprocess.Process) -> str:
        """How a log line names a server: Triton is started first, the frontend after it."""
        return "Triton" if process is self.state.processes[0] else "the frontend"


def triton_command(settings: EntrypointSettings, repository: Path, model: str) -> list[str]:
    """The tritonserver command line: explicit model control (a half-written model on the
    shared cache is never polled; Triton starts its endpoints only once ``--load-model`` has
    loaded, which keeps the public gRPC port closed until then), strict readiness, exit on
    error, loopback HTTP for the readiness checks, and the drain deadline as Triton's exit
    timeout."""
    return [
        *settings.tritonserver_argv(),
        f"--model-repository={repository}",
        "--model-control-mode=explicit",
        f"--load-model={model}",
        "--strict-readiness=true",
        "--exit-on-error=true",
        f"--grpc-address={settings.public_host}",
        f"--grpc-port={settings.public_grpc_port}",
        "--allow-http=true",
        "--http-address=127.0.0.1",
        f"--http-port={settings.triton_http_port}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={settings.triton_metrics_port}",
        f"--exit-timeout-secs={exit_timeout_secs(settings)}",
    ]


def _check_port_free(host: str, port: int) -> None:
    """Fail stage 7 if ``host:port`` cannot be bound, before Triton spends minutes loading a
    model only to fail binding it. (Something may still take it in between: then Triton exits
    and stage 8 reports it.)"""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as sock:
            # As Triton's gRPC server does: a port whose last connections linger is free.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        raise _Failed(
            7,
            f"the public gRPC port {host}:{port}, which Triton binds, is not free: {exc}",
            "stop whatever listens there or set LLM_SERVING_PUBLIC_GRPC_PORT",
        ) from exc


def exit_timeout_secs(settings: EntrypointSettings) -> int:
    """The drain deadline as Triton takes it (whole seconds, at least 1)."""
    return max(1, round(settings.drain_seconds))


def _exited_children() -> set[int]:
    """The pids of this process's children that have exited and wait to be reaped (zombies)."""
    me, found = os.getpid(), set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                state, ppid = stat.read().rpartition(b")")[2].split()[:2]
        except (OSError, ValueError):
            continue  # gone meanwhile
        if state == b"Z" and int(ppid) == me:
            found.add(int(entry.name))
    return found


def _how_it_ended(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:  # real-time signals between SIGRTMIN and SIGRTMAX have no name
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with {code}"


def _unexpected(exc: BaseException) -> str:
    """An exception nobody anticipated, as one line naming its type and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"unexpected {type(exc).__name__}{where}: {exc}"


def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


class _Stopped(Exception):
    """SIGTERM arrived before the gate opened: ``during`` stage ``number``, or after it."""

    def __init__(self, number: int, *, during: bool) -> None:
        super().__init__(f"stopped {'during' if during else 'after'} stage {number}")
        self.number, self.during = number, during


class _Failed(Exception):
    def __init__(self, number: int, message: str, fix: str) -> None:
        super().__init__(message)
        self.number, self.message, self.fix = number, message, fix
