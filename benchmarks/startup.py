"""Start-up benchmarks: unpack vs GNU tar, and the seconds each entrypoint stage adds against
the tritonserver stand-in (load time zero).

``python -m benchmarks.startup [--quick] [--json PATH] [--only unpack|startup]``. The full run
unpacks a 2 GiB package of 512 files; ``--quick`` a 256 MiB package of 128 files and one
start-up. The entrypoint and the stand-in run in separate processes, as in the pod. (Triton
binds the public gRPC port itself, so the entrypoint adds no hop to a request: there is no
gate to measure.)
"""

from __future__ import annotations

import argparse
import os
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

from benchmarks import write_rows
from runtime.entrypoint import STAGES
from runtime.package import build_package, unpack_archive
from runtime.package.manifest import FileEntry

ROOT = Path(__file__).resolve().parents[1]
_SHA = "0" * 64


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    """Run the benchmarks, print tables and the unpack ratio, optionally write JSON rows."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="256 MiB package, one start-up")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument(
        "--only", choices=["unpack", "startup"], action="append", help="run these only"
    )
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    sections: list[tuple[str, Callable[[Path], list[dict[str, Any]]]]] = [
        ("unpack", partial(lambda q, f: bench_unpack(f, q, 3 if q else 5), args.quick)),
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
    if args.json is not None:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
