"""Start-up benchmarks: unpack vs GNU tar, gRPC through the port gate vs direct, and the seconds
each entrypoint stage adds against the tritonserver stand-in (load time zero).

``python -m benchmarks.startup [--quick] [--json PATH] [--only unpack|gate|startup]
[--baseline-relay SO]``. The full
run unpacks a 2 GiB package of 512 files; ``--quick`` a 256 MiB package of 128 files, fewer
requests and one start-up. Everything runs in separate processes (stand-in, gates, entrypoint)
as in the pod; the gate section also runs the former asyncio relay for comparison, or, with
``--baseline-relay SO``, another build of the native relay (a ``_relay*.so``), to measure a
change to it side by side in one run. The gate
rows measure the relay (embedded mode, ``LLM_SERVING_GATE=relay``): a standalone Triton binds
the public port itself, so there a request takes no extra hop at all.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from runtime.entrypoint import STAGES
from runtime.package import build_package, unpack_archive
from runtime.package.manifest import FileEntry

ROOT = Path(__file__).resolve().parents[1]
_SHA = "0" * 64


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


# --- unpack -----------------------------------------------------------------------------------


def _make_archive(folder: Path, files: int, file_bytes: int) -> tuple[Path, list[FileEntry]]:
    block = os.urandom(1 << 20)
    data = (block * (file_bytes // len(block) + 1))[:file_bytes]
    source = folder / "src"
    entries = []
    for i in range(files):
        path = source / f"shard-{i // 64:03d}" / f"part-{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[i % 997 :] + data[: i % 997])  # distinct contents
        entries.append(
            FileEntry(path=path.relative_to(source).as_posix(), size=file_bytes, sha256=_SHA)
        )
    archive = folder / "package.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            tar.add(source / entry.path, arcname=entry.path)
    shutil.rmtree(source)
    return archive, entries


def bench_unpack(folder: Path, quick: bool, repeats: int) -> list[dict[str, Any]]:
    files, size = (128, 2 << 20) if quick else (512, 4 << 20)
    archive, entries = _make_archive(folder, files, size)
    total_mb = files * size / 1e6
    runs: dict[str, list[float]] = {"unpack": [], "gnu_tar": []}
    for i in range(repeats):
        for impl in ("gnu_tar", "unpack") if i % 2 else ("unpack", "gnu_tar"):
            dest = folder / f"out-{impl}-{i}"
            started = time.perf_counter()
            if impl == "unpack":
                unpack_archive(archive, entries, dest)
            else:
                dest.mkdir()
                subprocess.run(["tar", "-xf", str(archive), "-C", str(dest)], check=True)
            runs[impl].append(time.perf_counter() - started)
            shutil.rmtree(dest)
    archive.unlink()
    return [
        {
            "impl": impl,
            "files": files,
            "mb": round(total_mb, 1),
            "median_s": round(statistics.median(times), 4),
            "mb_per_s": round(total_mb / statistics.median(times), 1),
        }
        for impl, times in runs.items()
    ]


# --- gate vs direct -------------------------------------------------------------------------------

# Each gate runs in its own process, as in the pod (the entrypoint process holds the gate).
_GATE = """
import asyncio, sys, uvloop
if sys.argv[1] == "baseline_gate":  # another build of the native relay, loaded in its place
    import importlib.util, runtime.entrypoint
    spec = importlib.util.spec_from_file_location("runtime.entrypoint._relay", sys.argv[4])
    relay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(relay)
    sys.modules["runtime.entrypoint._relay"] = runtime.entrypoint._relay = relay
from runtime.entrypoint.gate import PortGate
from benchmarks._asyncio_relay import AsyncioPortGate
async def main():
    kind = AsyncioPortGate if sys.argv[1] == "asyncio_gate" else PortGate
    gate = kind("127.0.0.1", int(sys.argv[2]), "127.0.0.1", int(sys.argv[3]))
    await gate.open()
    await asyncio.Event().wait()
uvloop.run(main())
"""
# The HTTP/2 client preface and an empty SETTINGS frame: the server answers with its SETTINGS.
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
GATE_IMPLS = ("direct", "gate", "asyncio_gate")
# With --baseline-relay, a given build of the native relay takes the asyncio relay's place.
BASELINE_IMPLS = ("direct", "gate", "baseline_gate")
_RATIOS = {
    "p50_us": "p50_ratio",
    "p99_us": "p99_ratio",
    "tokens_per_s": "tokens_per_s_ratio",
    "connect_us": "connect_ratio",
}


def _unary(client: grpcclient.InferenceServerClient) -> float:
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"the quick brown fox"], dtype=object))
    params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([b'{"max_tokens": 1}'], dtype=object))
    started = time.perf_counter()
    client.infer("toy", [text, params])
    return time.perf_counter() - started


def _stream_tokens(client: grpcclient.InferenceServerClient, tokens: int) -> float:
    done: queue.Queue[Any] = queue.Queue()

    def callback(result: Any, error: Any) -> None:
        done.put(error or result)

    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"the quick brown fox"], dtype=object))
    stream = grpcclient.InferInput("stream", [1], "BOOL")
    stream.set_data_from_numpy(np.array([True]))
    params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([f'{{"max_tokens": {tokens}}}'.encode()], dtype=object))
    client.start_stream(callback=callback)
    started = time.perf_counter()
    client.async_stream_infer("toy", [text, stream, params], enable_empty_final_response=True)
    received = 0
    while True:
        item = done.get(timeout=60)
        if isinstance(item, Exception):
            raise item
        response = item.get_response()
        if response.outputs:
            received += 1
        if response.parameters["triton_final_response"].bool_param:
            break
    elapsed = time.perf_counter() - started
    client.stop_stream()
    return received / elapsed


def _connect(port: int) -> float:
    """Seconds from connect() to the server's first HTTP/2 bytes on a fresh connection."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(_H2_HELLO)
        if not sock.recv(1):
            raise RuntimeError(f"port {port} closed the connection without answering")
    return time.perf_counter() - started


def _cpu_ns(pid: int) -> int:
    """CPU time every thread of ``pid`` has run so far (Linux schedstat), in nanoseconds."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        total += int((task / "schedstat").read_text().split()[0])
    return total


def _alternate(
    round_: int, times: int, measure: Callable[[str], float], impls: tuple[str, ...]
) -> dict[str, list[float]]:
    """``measure`` each implementation in turn, ``times`` times, rotating who goes first."""
    results: dict[str, list[float]] = {impl: [] for impl in impls}
    for i in range(times):
        shift = (round_ + i) % len(impls)
        for impl in impls[shift:] + impls[:shift]:
            results[impl].append(measure(impl))
    return results


def bench_gate(quick: bool, baseline: Path | None = None) -> list[dict[str, Any]]:
    """Unary latency, streamed tokens/s and connection set-up: direct, native gate, and the
    asyncio relay (or ``baseline``, another build of the native relay's module).

    Calls alternate between the three (order rotated) so that noise from the rest of the
    machine hits all alike; a gate's ratios are the medians of its per-round ratios to direct.
    """
    impls = GATE_IMPLS if baseline is None else BASELINE_IMPLS
    extra = [] if baseline is None else [str(baseline.resolve())]
    ports = {impl: _free_port() for impl in impls}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KSERVE_STANDIN_LOAD_SECONDS": "0"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.kserve_server", "--model-repository", ".",
             f"--grpc-port={ports['direct']}", "--allow-http=false",
             "--model-control-mode=none"],
            env=env, cwd=ROOT, stderr=subprocess.DEVNULL,
        )
    ]  # fmt: skip
    for impl in impls[1:]:
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", _GATE, impl, str(ports[impl]), str(ports["direct"]), *extra],
                env=env,
                cwd=ROOT,
            )
        )
    rounds, unary_n, streams, tokens, connects = (
        (9, 200, 4, 150, 50) if quick else (15, 500, 8, 300, 200)
    )
    gate_pids = {impl: processes[1 + i].pid for i, impl in enumerate(impls[1:])}
    try:
        for port in ports.values():
            _wait_port(port)
        clients = {
            impl: grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
            for impl, port in ports.items()
        }
        for client in clients.values():  # warm-up: connections, HTTP/2 windows
            for _ in range(20):
                _unary(client)
        per_round: dict[str, dict[str, list[float]]] = {
            impl: {"p50_us": [], "p99_us": [], "tokens_per_s": [], "connect_us": []}
            for impl in impls
        }
        gate_cpu_ns = dict.fromkeys(gate_pids, 0)
        for r in range(rounds):
            cpu_before = {impl: _cpu_ns(pid) for impl, pid in gate_pids.items()}
            latencies = _alternate(r, unary_n, lambda impl: _unary(clients[impl]) * 1e6, impls)
            for impl, pid in gate_pids.items():
                gate_cpu_ns[impl] += _cpu_ns(pid) - cpu_before[impl]
            rates = _alternate(
                r, streams, lambda impl: _stream_tokens(clients[impl], tokens), impls
            )
            setups = _alternate(r, connects, lambda impl: _connect(ports[impl]) * 1e6, impls)
            for impl, measured in per_round.items():
                measured["p50_us"].append(float(np.percentile(latencies[impl], 50)))
                measured["p99_us"].append(float(np.percentile(latencies[impl], 99)))
                measured["tokens_per_s"].append(statistics.median(rates[impl]))
                measured["connect_us"].append(statistics.median(setups[impl]))
        for client in clients.values():
            client.close()
    finally:
        for process in reversed(processes):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
    rows = []
    for impl, measured in per_round.items():
        row: dict[str, Any] = {"impl": impl, "rounds": rounds, "requests": rounds * unary_n}
        row |= {key: round(statistics.median(v), 1) for key, v in measured.items()}
        if impl in gate_cpu_ns:
            # What relaying one unary call costs the gate process (both messages, all threads).
            row["gate_cpu_us_per_request"] = round(gate_cpu_ns[impl] / 1e3 / (rounds * unary_n), 1)
        if impl != "direct":
            direct = per_round["direct"]
            for key, values in measured.items():
                ratios = [a / b for a, b in zip(values, direct[key], strict=True)]
                row[_RATIOS[key]] = round(statistics.median(ratios), 3)
        rows.append(row)
    return rows


# --- full start-up ------------------------------------------------------------------------------

_STAGE_LINE = re.compile(r"stage (\d)/8 (\w+) done in ([0-9.]+)s")


def bench_startup(folder: Path, starts: int) -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT))
    from tests.runtime.wheelmaker import make_source  # the tests' tiny model and plugin wheel

    version = folder / "version"
    build_package(make_source(folder / "src"), version)
    prom = folder / "prom"
    prom.mkdir()
    seconds: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for i in range(starts):
        health = _free_port()
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "LLM_SERVING_PACKAGE_PATH": str(version),
            "LLM_SERVING_WORK_DIR": str(folder / f"work-{i}"),
            "LLM_SERVING_PLUGIN_DIR": str(folder / f"plugins-{i}"),
            "PROMETHEUS_MULTIPROC_DIR": str(prom),
            "LLM_SERVING_TRITON_RELEASE": "26.08",
            "LLM_SERVING_TRITONSERVER": f"{sys.executable} -m tests.support.kserve_server",
            "LLM_SERVING_PUBLIC_HOST": "127.0.0.1",
            "LLM_SERVING_HEALTH_HOST": "127.0.0.1",
            "LLM_SERVING_PUBLIC_GRPC_PORT": str(_free_port()),
            "LLM_SERVING_TRITON_GRPC_PORT": str(_free_port()),
            "LLM_SERVING_TRITON_HTTP_PORT": str(_free_port()),
            "LLM_SERVING_HEALTH_PORT": str(health),
            "KSERVE_STANDIN_LOAD_SECONDS": "0",
        }
        env.pop("PIP_CONSTRAINT", None)
        process = subprocess.Popen(
            [sys.executable, "-m", "runtime.entrypoint"],
            env=env,
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stderr is not None
        found: dict[str, float] = {}
        for line in process.stderr:
            match = _STAGE_LINE.search(line)
            if match:
                found[match.group(2)] = float(match.group(3))
            if "failed:" in line:
                raise RuntimeError(line.strip())
            if len(found) == len(STAGES):
                break
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
        for stage, value in found.items():
            seconds[stage].append(value)
    return [
        {"impl": "stage", "stage": stage, "seconds": round(statistics.median(v), 4)}
        for stage, v in seconds.items()
    ]


def _table(rows: list[dict[str, Any]]) -> str:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    widths = {k: max(len(k), *(len(str(r.get(k, ""))) for r in rows)) for k in keys}
    lines = ["  ".join(k.ljust(widths[k]) for k in keys)]
    lines += ["  ".join(str(r.get(k, "")).ljust(widths[k]) for k in keys) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the three benchmarks, print tables and ratios, optionally write JSON rows."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="256 MiB package, fewer requests")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument(
        "--only", choices=["unpack", "gate", "startup"], action="append", help="run these only"
    )
    parser.add_argument(
        "--baseline-relay",
        type=Path,
        help="a _relay*.so of another build, measured side by side in place of the asyncio relay",
    )
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    sections: list[tuple[str, Callable[[Path], list[dict[str, Any]]]]] = [
        ("unpack", partial(lambda q, f: bench_unpack(f, q, 3 if q else 5), args.quick)),
        ("gate", lambda _f: bench_gate(args.quick, args.baseline_relay)),
        ("startup", partial(lambda q, f: bench_startup(f, 1 if q else 3), args.quick)),
    ]
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for name, run in sections:
            if args.only and name not in args.only:
                continue
            folder = Path(tmp) / name
            folder.mkdir()
            section = run(folder)
            print(f"== {name}\n{_table(section)}\n", flush=True)
            rows += section
    by_impl = {r["impl"]: r for r in rows if r["impl"] != "stage"}
    if "unpack" in by_impl:
        unpack_ratio = by_impl["unpack"]["mb_per_s"] / by_impl["gnu_tar"]["mb_per_s"]
        print(f"unpack / gnu_tar speed: {unpack_ratio:.2f}")
    for impl in (*GATE_IMPLS[1:], BASELINE_IMPLS[-1]):
        if (gate := by_impl.get(impl)) is None:
            continue
        print(
            f"{impl} / direct (median of per-round ratios): p50 {gate['p50_ratio']:.3f}, "
            f"p99 {gate['p99_ratio']:.3f}, tokens/s {gate['tokens_per_s_ratio']:.3f}, "
            f"connect {gate['connect_ratio']:.3f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
