"""Latency the OpenAI frontend adds over a direct KServe gRPC call, and streamed tokens/s.

Both paths hit the same KServe v2 stand-in (``tests.support.kserve_server``, a subprocess);
the frontend runs as ``python -m runtime.frontend`` in its own subprocess. Non-streamed
requests measure per-request latency (p50/p99) at concurrency 1 and 64; streamed requests
measure generated tokens per second through the frontend versus direct.

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
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

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
    """Start the stand-in and the frontend as subprocesses; yield (grpc_url, http_url)."""
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
            yield f"127.0.0.1:{grpc_port}", http_url
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
    """One request over ModelStreamInfer, as the frontend sends it; returns tokens received."""
    inputs = _inputs(max_tokens, stream)

    async def one():
        yield {"model_name": MODEL, "inputs": inputs}

    tokens = 0
    call = client.stream_infer(one())
    try:
        async for result, error in call:
            if error is not None:
                raise RuntimeError(error)
            tokens += int(result.as_numpy("num_output_tokens").sum())
            if all(r != b"None" for r in result.as_numpy("finish_reason")):
                break
    finally:
        call.cancel()
    return tokens


async def _frontend(client: aiohttp.ClientSession, url: str, max_tokens: int, stream: bool) -> int:
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    async with client.post(url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        if not stream:
            return (await response.json())["usage"]["completion_tokens"]
        tokens = 0
        async for line in response.content:
            if line.startswith(b"data: {"):
                tokens += 1
        return tokens


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


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _run(grpc_url: str, http_url: str, quick: bool) -> list[dict[str, Any]]:
    direct = grpcclient.InferenceServerClient(grpc_url)
    # aiohttp, not httpx: httpx's connection pool dominated the client side at concurrency 64.
    http = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=128), timeout=aiohttp.ClientTimeout(total=60)
    )
    impls = {
        "direct": lambda mt, s: _direct(direct, mt, s),
        "frontend": lambda mt, s: _frontend(http, http_url, mt, s),
    }
    rows = []
    latency_tokens, stream_tokens = 8, 64 if not quick else 32
    plan = [
        (1, False, 60 if quick else 400, latency_tokens),
        (64, False, 320 if quick else 2560, latency_tokens),
        (1, True, 8 if quick else 32, stream_tokens),
        (64, True, 128 if quick else 512, stream_tokens),
    ]
    for concurrency, stream, requests, max_tokens in plan:
        # Interleave warm-up and measurement per implementation, side by side in this run.
        for impl, fn in impls.items():

            def call(fn=fn, max_tokens=max_tokens, stream=stream) -> Awaitable[int]:
                return fn(max_tokens, stream)

            await _load(call, concurrency, min(requests, 32))
            lat, tokens, wall = await _load(call, concurrency, requests)
            rows.append(
                {
                    "impl": impl,
                    "concurrency": concurrency,
                    "stream": stream,
                    "requests": requests,
                    "max_tokens": max_tokens,
                    "p50_us": round(statistics.median(lat) * 1e6, 1),
                    "p99_us": round(_pct(lat, 0.99) * 1e6, 1),
                    "tokens_per_s": round(tokens / wall, 1),
                }
            )
    await http.close()
    await direct.close()
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    head = f"{'impl':<9} {'conc':>4} {'stream':>6} {'p50_us':>10} {'p99_us':>10} {'tokens/s':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['impl']:<9} {r['concurrency']:>4} {r['stream']!s:>6} {r['p50_us']:>10.1f} "
            f"{r['p99_us']:>10.1f} {r['tokens_per_s']:>10.1f}"
        )
    by = {(r["impl"], r["concurrency"], r["stream"]): r for r in rows}
    for c in (1, 64):
        added = by[("frontend", c, False)]["p50_us"] - by[("direct", c, False)]["p50_us"]
        print(f"added p50 latency, non-streamed, concurrency {c}: {added:.1f} us")
    for c in (1, 64):
        ratio = by[("frontend", c, True)]["tokens_per_s"] / by[("direct", c, True)]["tokens_per_s"]
        print(f"streamed tokens/s frontend / direct, concurrency {c}: {ratio:.1%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (about a minute)")
    parser.add_argument("--json", type=Path, help="write the rows as JSON to this path")
    args = parser.parse_args(argv)
    with _servers() as (grpc_url, http_url):
        rows = asyncio.run(_run(grpc_url, http_url, args.quick))
    _print(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
