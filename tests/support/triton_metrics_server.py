"""Stand-in for Triton's metrics endpoint (port 8002): an HTTP server replaying its exposition.

Real Triton's metrics port is scraped in ``tests/runtime/test_pod_real_triton.py``; this
replay stays where a test needs exact values, GPU families (Triton exports them only where it
sees a GPU), a bad body or a slow endpoint. It renders, in Triton's text format and
label scheme (``model``/``version``, ``gpu_uuid``, failure ``reason``), the families FACTS.md
lists for each model, plus the 8 ``vllm:*`` families Triton's vLLM backend bridges. Counters
advance only on ``advance()``, so tests know the exact values; ``delay_s`` makes it slow.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["TritonMetricsServer", "render_exposition"]

_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "Number of model executions performed"),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds"),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds",
    ),
)
_FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
_GPU_UUID = "GPU-5b1e0c8a-2f7d-4c1e-9a43-0d6e1f2a3b4c"
_FIRST_RESPONSE_BUCKETS = ("1", "10", "100", "1000", "10000", "+Inf")
_BRIDGED_HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", ("0.04", "0.25", "1", "2.5", "5", "+Inf")),
    ("vllm:time_per_output_token_seconds", ("0.01", "0.025", "0.05", "0.1", "+Inf")),
    ("vllm:e2e_request_latency_seconds", ("1", "2.5", "5", "10", "+Inf")),
    ("vllm:request_prompt_tokens", ("100", "200", "500", "1000", "+Inf")),
    ("vllm:request_generation_tokens", ("100", "200", "500", "1000", "+Inf")),
    ("vllm:request_params_n", ("1", "2", "5", "+Inf")),
)


def render_exposition(models: tuple[str, ...], step: int) -> str:
    """Triton's /metrics after ``step`` rounds of traffic (90 successes, 10 failures each)."""
    out: list[str] = []

    def family(name: str, typ: str, help_text: str, lines: list[str]) -> None:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {typ}\n")
        out.extend(line + "\n" for line in lines)

    family(
        "nv_inference_request_success",
        "counter",
        _COUNTERS[0][1],
        [f'nv_inference_request_success{{model="{m}",version="1"}} {90 * step}' for m in models],
    )
    family(
        "nv_inference_request_failure",
        "counter",
        "Number of failed inference requests, all batch sizes",
        [
            f'nv_inference_request_failure{{model="{m}",reason="{r}",version="1"}} '
            f"{10 * step if r == 'BACKEND' else 0}"
            for m in models
            for r in _FAILURE_REASONS
        ],
    )
    for i, (name, help_text) in enumerate(_COUNTERS[1:], 2):
        family(
            name,
            "counter",
            help_text,
            [f'{name}{{model="{m}",version="1"}} {i * 100 * step}' for m in models],
        )
    family(
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
        [f'nv_inference_pending_request_count{{model="{m}",version="1"}} 3' for m in models],
    )
    family(
        "nv_model_load_duration_secs",
        "gauge",
        "Model load time in seconds",
        [f'nv_model_load_duration_secs{{model="{m}",version="1"}} 42.5' for m in models],
    )
    buckets = []
    hist = "nv_inference_first_response_histogram_ms"
    for m in models:
        labels = f'model="{m}",version="1"'
        for le in _FIRST_RESPONSE_BUCKETS:
            count = 0 if le in ("1", "10") else 100 * step
            buckets.append(f'{hist}_bucket{{{labels},le="{le}"}} {count}')
        buckets.append(f"{hist}_sum{{{labels}}} {25000 * step}")
        buckets.append(f"{hist}_count{{{labels}}} {100 * step}")
    family(
        "nv_inference_first_response_histogram_ms",
        "histogram",
        "Duration from request to first response in milliseconds",
        buckets,
    )
    gpu = f'gpu_uuid="{_GPU_UUID}"'
    family(
        "nv_gpu_utilization",
        "gauge",
        "GPU utilization rate [0.0 - 1.0)",
        [f"nv_gpu_utilization{{{gpu}}} 0.83"],
    )
    family(
        "nv_gpu_memory_total_bytes",
        "gauge",
        "GPU total memory, in bytes",
        [f"nv_gpu_memory_total_bytes{{{gpu}}} 85899345920"],
    )
    family(
        "nv_gpu_memory_used_bytes",
        "gauge",
        "GPU used memory, in bytes",
        [f"nv_gpu_memory_used_bytes{{{gpu}}} 77309411328"],
    )
    family(
        "nv_gpu_power_usage",
        "gauge",
        "GPU power usage in watts",
        [f"nv_gpu_power_usage{{{gpu}}} 612.5"],
    )
    family(
        "nv_gpu_power_limit",
        "gauge",
        "GPU power management limit in watts",
        [f"nv_gpu_power_limit{{{gpu}}} 700"],
    )
    family(
        "nv_cpu_utilization",
        "gauge",
        "CPU utilization rate [0.0 - 1.0]",
        ["nv_cpu_utilization 0.21"],
    )
    family(
        "nv_cpu_memory_total_bytes",
        "gauge",
        "CPU total memory (RAM), in bytes",
        ["nv_cpu_memory_total_bytes 2164663517184"],
    )
    family(
        "nv_cpu_memory_used_bytes",
        "gauge",
        "CPU used memory (RAM), in bytes",
        ["nv_cpu_memory_used_bytes 412316860416"],
    )
    # The vLLM backend's bridge: 2 counters and 6 histograms, labelled like Triton's own.
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        family(
            name,
            "counter",
            "Number of tokens processed.",
            [f'{name}{{model="{m}",version="1"}} {1000 * step}' for m in models],
        )
    for name, les in _BRIDGED_HISTOGRAMS:
        lines = []
        for m in models:
            lines.extend(
                f'{name}_bucket{{model="{m}",version="1",le="{le}"}} {7 * step}' for le in les
            )
            lines.append(f'{name}_sum{{model="{m}",version="1"}} {11 * step}')
            lines.append(f'{name}_count{{model="{m}",version="1"}} {7 * step}')
        family(name, "histogram", f"Bridged {name}", lines)
    return "".join(out)


class TritonMetricsServer:
    """Threaded HTTP server on 127.0.0.1 answering ``GET /metrics`` like Triton's port 8002."""

    def __init__(self, models: tuple[str, ...] = ("llama-3-8b",), delay_s: float = 0.0) -> None:
        self.models = models
        self.delay_s = delay_s
        self.step = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._body = render_exposition(models, 0).encode()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; without this, Nagle's algorithm and
            # delayed ACKs add 40 ms to every scrape, which Triton's own server does not.
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                with server._lock:
                    server.requests += 1
                    body, delay = server._body, server.delay_s
                if delay:
                    time.sleep(delay)
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    # A scraper that gave up (a proxy's fetch timeout) is not an error here.
                    # socketserver would print its traceback to stderr, into whichever test
                    # runs when the delay ends.
                    self.close_connection = True

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # 20 concurrent scrapers must not overflow the backlog
            daemon_threads = True

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/metrics"

    def advance(self) -> None:
        """One more round of traffic: counters and histograms grow."""
        with self._lock:
            self.step += 1
            self._body = render_exposition(self.models, self.step).encode()

    def exposition(self) -> str:
        """What a scrape returns now."""
        with self._lock:
            return self._body.decode()

    def __enter__(self) -> TritonMetricsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def main() -> None:
    """Serve until stdin closes: ``python -m tests.support.triton_metrics_server --models a,b``."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="llama-3-8b", help="comma-separated model names")
    parser.add_argument("--steps", type=int, default=1, help="rounds of traffic to replay")
    args = parser.parse_args()
    with TritonMetricsServer(tuple(args.models.split(","))) as server:
        for _ in range(args.steps):
            server.advance()
        print(server.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
