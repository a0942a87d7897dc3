"""Latency the OpenAI frontend adds over a direct KServe gRPC call, and streamed tokens/s.

Both paths hit the same KServe v2 stand-in (``tests.support.kserve_server``, a subprocess);
the frontend runs as ``python -m runtime.frontend`` in its own subprocess. Non-streamed
requests measure per-request latency (p50/p99) at concurrency 1 and 64; streamed requests
measure generated tokens per second through the frontend versus direct, the tokens counted
from the usage the frontend reports (a chunk may carry several) and from the backend's
``num_output_tokens``. Each configuration runs in interleaved rounds (direct, frontend,
frontend, direct, ...) so that noise on a shared machine falls on both alike, and every row
also reports the CPU time each process (client, frontend, stand-in) spent per token.

    python -m benchmarks.frontend [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from benchmarks import write_rows

__all__ = ["main"]

MODEL = "llm"
PROMPT = "the cat sat on the mat and"
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_model_files(directory: Path) -> tuple[Path, Path]:
    repo = directory / "repo" / MODEL
    (repo / "1").mkdir(parents=True)
    (repo / "config.pbtxt").write_text(
        'backend: "vllm"\nmodel_transaction_policy { decoupled: true }\n'
    )
    (repo / "1" / "model.json").write_text("{}")
    tok = directory / "tokenizer"
    tok.mkdir()
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.save(str(tok / "tokenizer.json"))
    template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    (tok / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return directory / "repo", tok


def _wait(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # not up yet: any transport error means retry
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not become ready within {timeout:g} s")


@contextmanager
def _servers():
    """Start the stand-in and the frontend as subprocesses; yield their URLs and pids."""
    with tempfile.TemporaryDirectory() as tmp:
        repo, tok = _write_model_files(Path(tmp))
        grpc_port, http_port = _free_port(), _free_port()
        standin = subprocess.Popen(
            [
                sys.executable, "-m", "tests.support.kserve_server",
                f"--model-repository={repo}", f"--grpc-port={grpc_port}",
                "--allow-http=false", "--model-control-mode=explicit", f"--load-model={MODEL}",
            ],
            cwd=ROOT,
        )  # fmt: skip
        env = {
            **os.environ,
            "LLM_SERVING_FRONTEND_TRITON_URL": f"127.0.0.1:{grpc_port}",
            "LLM_SERVING_FRONTEND_MODEL_NAME": MODEL,
            "LLM_SERVING_FRONTEND_TOKENIZER_DIR": str(tok),
            "LLM_SERVING_FRONTEND_STRUCTURED_OUTPUTS_KEY": "structured_outputs",
            "LLM_SERVING_FRONTEND_HOST": "127.0.0.1",
            "LLM_SERVING_FRONTEND_PORT": str(http_port),
            "LLM_SERVING_FRONTEND_MAX_MODEL_LEN": "512",
        }
        frontend = subprocess.Popen(
            [sys.executable, "-m", "runtime.frontend"],
            cwd=ROOT,
            env=env,
            stderr=subprocess.DEVNULL,
        )
        http_url = f"http://127.0.0.1:{http_port}"
        try:
            _wait(lambda: httpx.get(http_url + "/health/ready").status_code == 200, "the frontend")
            pids = {"standin": standin.pid, "frontend": frontend.pid}
            yield f"127.0.0.1:{grpc_port}", http_url, pids
        finally:
            for proc in (frontend, standin):
                proc.terminate()
                proc.wait(15)


def _inputs(max_tokens: int, stream: bool) -> list[grpcclient.InferInput]:
    def tensor(name: str, value: Any, dtype: str) -> grpcclient.InferInput:
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=np.object_ if dtype == "BYTES" else bool))
        return t

    params = json.dumps({"max_tokens": max_tokens, "temperature": 0.0}).encode()
    return [
        tensor("text_input", PROMPT.encode(), "BYTES"),
        tensor("stream", stream, "BOOL"),
        tensor("sampling_parameters", params, "BYTES"),
        tensor("exclude_input_in_output", True, "BOOL"),
        tensor("return_finish_reason", True, "BOOL"),
        tensor("return_num_input_tokens", True, "BOOL"),
        tensor("return_num_output_tokens", True, "BOOL"),
        tensor("return_logprobs", False, "BOOL"),
    ]


async def _direct(client: grpcclient.InferenceServerClient, max_tokens: int, stream: bool) -> int:
    """One request over ModelStreamInfer, as the frontend sends it; returns tokens received.

    Like any client it decodes what it reads: the text, the finish reasons, the token counts.
    """
    inputs = _inputs(max_tokens, stream)

    async def one():
        yield {"model_name": MODEL, "inputs": inputs}

    tokens = 0
    text: list[str] = []
    call = client.stream_infer(one())
    try:
        async for result, error in call:
            if error is not None:
                raise RuntimeError(error)
            text.extend(t.decode() for t in result.as_numpy("text_output"))
            tokens += int(result.as_numpy("num_output_tokens").sum())
            if all(r != b"None" for r in result.as_numpy("finish_reason")):
                break
    finally:
        call.cancel()
    return tokens


async def _frontend(client: aiohttp.ClientSession, url: str, max_tokens: int, stream: bool) -> int:
    """One completion through the frontend; returns the completion tokens its usage reports.

    Tokens are counted from usage, never from chunks: a chunk may carry several tokens. Each
    chunk is parsed as an SDK would, and its text read.
    """
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with client.post(url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        if not stream:
            return (await response.json())["usage"]["completion_tokens"]
        tokens = 0
        text: list[str] = []
        async for line in response.content:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                text.extend(c["text"] for c in chunk["choices"])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        return tokens


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class _Tally:
    """What one implementation accumulated over the interleaved rounds of one configuration."""

    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    round_rates: list[float] = field(default_factory=list)


async def _load(
    call: Callable[[], Awaitable[int]], concurrency: int, requests: int
) -> tuple[list[float], int, float]:
    """Run ``requests`` calls with ``concurrency`` workers; latencies (s), tokens, wall (s)."""
    latencies: list[float] = []
    tokens = 0
    remaining = requests

    async def worker() -> None:
        nonlocal tokens, remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            received = await call()
            latencies.append(time.perf_counter() - start)
            tokens += received

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, tokens, time.perf_counter() - start


async def _measure(
    call: Callable[[], Awaitable[int]],
    concurrency: int,
    requests: int,
    pids: dict[str, int],
    tally: _Tally,
) -> None:
    """One round: ``requests`` calls, their latencies, tokens, wall time and every process's CPU."""
    before = {name: _cpu_s(pid) for name, pid in pids.items()}
    lat, tokens, wall = await _load(call, concurrency, requests)
    for name, pid in pids.items():
        tally.cpu_s[name] = tally.cpu_s.get(name, 0.0) + _cpu_s(pid) - before[name]
    tally.latencies += lat
    tally.tokens += tokens
    tally.wall_s += wall
    tally.round_rates.append(tokens / wall)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _run(
    grpc_url: str, http_url: str, pids: dict[str, int], quick: bool
) -> list[dict[str, Any]]:
    direct = grpcclient.InferenceServerClient(grpc_url)
    # aiohttp, not httpx: httpx's connection pool dominated the client side at concurrency 64.
    # Idle connections are dropped here before uvicorn's 5 s keep-alive closes them, which
    # would race a request sent after a long direct round on a connection being closed.
    connector = aiohttp.TCPConnector(limit=128, keepalive_timeout=2)
    http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120))
    impls = {
        "direct": lambda mt, s: _direct(direct, mt, s),
        "frontend": lambda mt, s: _frontend(http, http_url, mt, s),
    }
    pids = {**pids, "client": os.getpid()}
    rows = []
    # Both paths get the same prompt and max_tokens; the stand-in makes exactly max_tokens.
    latency_tokens, stream_tokens = 8, 64
    rounds = 4 if quick else 10
    plan = [
        (1, False, 40 if quick else 100, latency_tokens),
        (64, False, 128 if quick else 640, latency_tokens),
        (1, True, 4 if quick else 24, stream_tokens),
        (64, True, 96 if quick else 256, stream_tokens),
    ]
    for concurrency, stream, requests, max_tokens in plan:
        tallies = {impl: _Tally() for impl in impls}
        calls = {
            impl: (lambda fn=fn, mt=max_tokens, s=stream: fn(mt, s)) for impl, fn in impls.items()
        }
        for impl in impls:  # warm-up, not measured
            await _load(calls[impl], concurrency, min(requests, 64))
        # Interleaved rounds, the order flipped every round (ABBA...), so that machine noise
        # and drift fall on both implementations alike.
        for r in range(rounds):
            order = list(impls) if r % 2 == 0 else list(reversed(impls))
            for impl in order:
                await _measure(calls[impl], concurrency, requests, pids, tallies[impl])
        for impl, t in tallies.items():
            row = {
                "impl": impl,
                "concurrency": concurrency,
                "stream": stream,
                "requests": requests * rounds,
                "max_tokens": max_tokens,
                "p50_us": round(statistics.median(t.latencies) * 1e6, 1),
                "p99_us": round(_pct(t.latencies, 0.99) * 1e6, 1),
                "tokens_per_s": round(t.tokens / t.wall_s, 1),
                "round_tokens_per_s_min": round(min(t.round_rates), 1),
                "round_tokens_per_s_max": round(max(t.round_rates), 1),
            }
            for name, cpu in sorted(t.cpu_s.items()):
                if impl == "direct" and name == "frontend":
                    continue
                row[f"{name}_cpu_us_per_token"] = round(cpu / t.tokens * 1e6, 1)
            if impl == "frontend":
                # Each round beside the direct round next to it: a burst of load elsewhere
                # moves one pair, not the median.
                pairs = zip(t.round_rates, tallies["direct"].round_rates, strict=True)
                row["tokens_per_s_ratio_round_median"] = round(
                    statistics.median(f / d for f, d in pairs), 4
                )
            rows.append(row)
    await http.close()
    await direct.close()
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'impl':<9} {'conc':>4} {'stream':>6} {'p50_us':>10} {'p99_us':>10} {'tokens/s':>10}"
        f" {'cpu us/token: client':>21} {'frontend':>9} {'stand-in':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        front = r.get("frontend_cpu_us_per_token")
        print(
            f"{r['impl']:<9} {r['concurrency']:>4} {r['stream']!s:>6} {r['p50_us']:>10.1f} "
            f"{r['p99_us']:>10.1f} {r['tokens_per_s']:>10.1f} "
            f"{r['client_cpu_us_per_token']:>21.1f} "
            f"{'-' if front is None else format(front, '.1f'):>9} "
            f"{r['standin_cpu_us_per_token']:>9.1f}"
        )
    by = {(r["impl"], r["concurrency"], r["stream"]): r for r in rows}
    for c in (1, 64):
        added = by[("frontend", c, False)]["p50_us"] - by[("direct", c, False)]["p50_us"]
        print(f"added p50 latency, non-streamed, concurrency {c}: {added:.1f} us")
    for c in (1, 64):
        front, direct = by[("frontend", c, True)], by[("direct", c, True)]
        ratio = front["tokens_per_s"] / direct["tokens_per_s"]
        print(
            f"streamed tokens/s frontend / direct, concurrency {c}: {ratio:.1%}, median of "
            f"the rounds {front['tokens_per_s_ratio_round_median']:.1%} "
            f"(rounds: frontend {front['round_tokens_per_s_min']:.0f}-"
            f"{front['round_tokens_per_s_max']:.0f}, direct {direct['round_tokens_per_s_min']:.0f}-"
            f"{direct['round_tokens_per_s_max']:.0f} tokens/s)"
        )
    # On a shared machine the wall-clock ratio also measures how the scheduler shares the
    # cores among three processes versus two; CPU per token is what the frontend costs.
    for c in (1, 64):
        front, direct = by[("frontend", c, True)], by[("direct", c, True)]
        cost = {
            impl: _cpu_per_token(row) for impl, row in (("frontend", front), ("direct", direct))
        }
        print(
            f"streamed, concurrency {c}: CPU per token, all processes: direct "
            f"{cost['direct']:.0f} us, frontend {cost['frontend']:.0f} us; tokens per CPU-second "
            f"frontend / direct: {cost['direct'] / cost['frontend']:.1%}"
        )


def _cpu_per_token(row: dict[str, Any]) -> float:
    return sum(v for k, v in row.items() if k.endswith("_cpu_us_per_token"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (about a minute)")
    parser.add_argument("--json", type=Path, help="write the rows as JSON to this path")
    args = parser.parse_args(argv)
    with _servers() as (grpc_url, http_url, pids):
        rows = asyncio.run(_run(grpc_url, http_url, pids, args.quick))
    _print(rows)
    if args.json:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
