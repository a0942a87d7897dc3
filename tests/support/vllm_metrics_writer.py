"""Stand-in for vLLM's engine/API processes: writes vLLM's metric families in multiprocess mode.

vLLM itself needs a GPU here, so this process declares the same families (names, types,
label names, buckets and gauge multiprocess modes of ``vllm/v1/metrics/loggers.py``, the
family list of ``tests/metrics_proxy/data/vllm-metrics.tsv``) with the real
``prometheus_client`` classes and updates them deterministically. Run it as
``python -m tests.support.vllm_metrics_writer --index I`` with ``PROMETHEUS_MULTIPROC_DIR``
set; it reads commands on stdin (``tick`` applies one round, ``exit`` ends) and answers
``ok``. ``expected_sums`` says what the merge of several such processes must contain.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field

__all__ = [
    "BRIDGED",
    "FAMILIES",
    "FamilySpec",
    "apply_tick",
    "create_metrics",
    "engine_of",
    "expected_sums",
]

MODEL_NAME = "llama-3-8b"
ENGINES = 2
_BASE_LABELS = ("model_name", "engine")


def _buckets_1_2_5(max_value: int) -> tuple[float, ...]:
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(float(v) for v in out)
            out.append(value)
        exponent += 1


_TOKENS = _buckets_1_2_5(4096)
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0)
_TTFT += (7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5)
_ITL += (10.0, 20.0, 40.0, 80.0)
_REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
_REQUEST += (120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_RESIDENCY = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60)
_RESIDENCY += (120, 300, 600, 1200, 1800)


@dataclass(frozen=True)
class FamilySpec:
    """One vLLM family: type, extra label values per series, buckets, gauge mode, observation."""

    name: str
    type: str
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict)
    buckets: tuple[float, ...] = ()
    mode: str = "mostrecent"
    observe: float = 1.0

    def label_names(self) -> tuple[str, ...]:
        if self.name == "vllm:lora_requests_info":
            return tuple(self.extra)
        return _BASE_LABELS + tuple(self.extra)

    def series_extras(self) -> list[tuple[str, ...]]:
        """Every combination of extra label values (one series each per engine)."""
        combos: list[tuple[str, ...]] = [()]
        for values in self.extra.values():
            combos = [(*c, v) for c in combos for v in values]
        return combos


def _c(name: str, **extra: tuple[str, ...]) -> FamilySpec:
    return FamilySpec(name, "counter", extra)


def _h(name: str, buckets: tuple[float, ...], observe: float) -> FamilySpec:
    return FamilySpec(name, "histogram", buckets=tuple(float(b) for b in buckets), observe=observe)


def _g(name: str, mode: str = "mostrecent", **extra: tuple[str, ...]) -> FamilySpec:
    return FamilySpec(name, "gauge", extra, mode=mode)


# Families vLLM 0.27.1 (installed here) lacks, present in the 0.33.0 list: admission_rejections,
# watermark_requests, prompt_tokens_cached_by_source, num_requests_kv_fetch_by_stage and
# request_num_preemptions. Their extra labels and buckets here are assumptions, not read
# from vLLM's source; every other family mirrors vllm/v1/metrics/loggers.py of 0.27.1.
FAMILIES: tuple[FamilySpec, ...] = (
    _c("vllm:admission_rejections"),
    _c("vllm:corrupted_requests"),
    _h("vllm:e2e_request_latency_seconds", _REQUEST, 4.0),
    _g("vllm:engine_sleep_state", sleep_state=("awake", "weights_offloaded", "discard_all")),
    _c("vllm:estimated_flops_per_gpu_total"),
    _c("vllm:estimated_read_bytes_per_gpu_total"),
    _c("vllm:estimated_write_bytes_per_gpu_total"),
    _c("vllm:external_prefix_cache_hits"),
    _c("vllm:external_prefix_cache_queries"),
    _c("vllm:generation_tokens"),
    _h("vllm:inter_token_latency_seconds", _ITL, 0.04),
    _h("vllm:iteration_tokens_total", (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096), 48),
    _h("vllm:kv_block_idle_before_evict_seconds", _RESIDENCY, 3.0),
    _h("vllm:kv_block_lifetime_seconds", _RESIDENCY, 15.0),
    _h("vllm:kv_block_reuse_gap_seconds", _RESIDENCY, 0.3),
    _g("vllm:kv_cache_usage_perc"),
    FamilySpec(
        "vllm:lora_requests_info",
        "gauge",
        {"max_lora": ("4",), "waiting_lora_adapters": ("",), "running_lora_adapters": ("a",)},
        mode="sum",
    ),
    _c("vllm:mm_cache_hits"),
    _c("vllm:mm_cache_queries"),
    _c("vllm:num_preemptions"),
    _g("vllm:num_requests_kv_fetch_by_stage", stage=("waiting", "transferring")),
    _g("vllm:num_requests_running"),
    _g("vllm:num_requests_waiting"),
    _g("vllm:num_requests_waiting_by_reason", reason=("capacity", "deferred")),
    _c("vllm:prefix_cache_hits"),
    _c("vllm:prefix_cache_queries"),
    _c("vllm:prompt_tokens"),
    _c(
        "vllm:prompt_tokens_by_source",
        source=("local_compute", "local_cache_hit", "external_kv_transfer"),
    ),
    _c("vllm:prompt_tokens_cached"),
    _c("vllm:prompt_tokens_cached_by_source", source=("local", "external")),
    _h("vllm:request_decode_time_seconds", _REQUEST, 3.0),
    _h("vllm:request_generation_tokens", _TOKENS, 150),
    _h("vllm:request_inference_time_seconds", _REQUEST, 3.5),
    _h("vllm:request_max_num_generation_tokens", _TOKENS, 256),
    _h("vllm:request_num_preemptions", (0, 1, 2, 5, 10, 20), 1),
    _h("vllm:request_params_max_tokens", _TOKENS, 256),
    _h("vllm:request_params_n", (1, 2, 5, 10, 20), 1),
    _h("vllm:request_prefill_kv_computed_tokens", _TOKENS, 300),
    _h("vllm:request_prefill_time_seconds", _REQUEST, 0.4),
    _h("vllm:request_prompt_tokens", _TOKENS, 400),
    _h("vllm:request_queue_time_seconds", _REQUEST, 0.6),
    _c(
        "vllm:request_success",
        finished_reason=("stop", "length", "abort", "error", "repetition"),
    ),
    _h("vllm:request_time_per_output_token_seconds", _ITL, 0.04),
    _c("vllm:spec_decode_num_accepted_tokens_per_pos", position=("0", "1", "2")),
    # Over the alert's 2.5 s budget on purpose: the live test expects that alert to fire.
    _h("vllm:time_to_first_token_seconds", _TTFT, 3.0),
    _c("vllm:watermark_requests"),
)

BRIDGED = (
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:time_to_first_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_params_n",
)
"""The 8 families Triton's vLLM backend forwards to Triton's own /metrics (FACTS.md)."""


def engine_of(index: int) -> str:
    """Processes share engines two by two, so the merge must add across processes."""
    return str(index % ENGINES)


def _gauge_value(spec: FamilySpec, engine: int, tick: int) -> float:
    # Same value for every process of an engine, so "mostrecent" is deterministic.
    if spec.name == "vllm:kv_cache_usage_perc":
        return 0.97  # saturated on purpose: the live test expects that alert to fire
    if spec.name == "vllm:num_requests_waiting":
        return 6.0 * tick + engine  # grows every tick: the "waiting growing" alert fires
    if spec.name == "vllm:num_requests_running":
        return 4.0 + engine
    if spec.name == "vllm:lora_requests_info":
        return 1.0
    return float(tick + engine)


def _counter_step(spec: FamilySpec, index: int) -> float:
    if spec.name == "vllm:prefix_cache_hits":
        return 3.0 * (index + 1)
    if spec.name == "vllm:prefix_cache_queries":
        return 10.0 * (index + 1)
    return float(index + 1)


def create_metrics(registry: object | None = None) -> dict[str, object]:
    """Declare every family with ``prometheus_client`` (multiprocess if the env var is set)."""
    from prometheus_client import Counter, Gauge, Histogram

    metrics: dict[str, object] = {}
    for spec in FAMILIES:
        kwargs = {"labelnames": spec.label_names(), "registry": registry}
        if spec.type == "counter":
            metrics[spec.name] = Counter(spec.name, f"vLLM {spec.name}", **kwargs)
        elif spec.type == "histogram":
            metrics[spec.name] = Histogram(
                spec.name, f"vLLM {spec.name}", buckets=spec.buckets, **kwargs
            )
        else:
            metrics[spec.name] = Gauge(
                spec.name, f"vLLM {spec.name}", multiprocess_mode=spec.mode, **kwargs
            )
    return metrics


def _label_values(spec: FamilySpec, engine: str, extra: tuple[str, ...]) -> tuple[str, ...]:
    if spec.name == "vllm:lora_requests_info":
        return extra
    return (MODEL_NAME, engine, *extra)


def apply_tick(metrics: dict[str, object], index: int, tick: int) -> None:
    """Apply round ``tick`` (1-based) of process ``index``'s deterministic updates."""
    engine = engine_of(index)
    for spec in FAMILIES:
        metric = metrics[spec.name]
        for extra in spec.series_extras():
            child = metric.labels(*_label_values(spec, engine, extra))  # type: ignore[attr-defined]
            if spec.type == "counter":
                child.inc(_counter_step(spec, index))
            elif spec.type == "histogram":
                child.observe(spec.observe)
            else:
                child.set(_gauge_value(spec, int(engine), tick))


def expected_sums(processes: int, ticks: int) -> dict[str, float]:
    """Per sample name, the sum over all series that merging ``processes`` writers must give."""
    sums: dict[str, float] = defaultdict(float)
    engines = {int(engine_of(i)) for i in range(processes)}
    for spec in FAMILIES:
        combos = len(spec.series_extras())
        if spec.type == "counter":
            base = spec.name.removesuffix("_total")
            total = sum(_counter_step(spec, i) for i in range(processes)) * ticks
            sums[f"{base}_total"] += total * combos
        elif spec.type == "histogram":
            observations = processes * ticks * combos
            sums[f"{spec.name}_count"] += observations
            sums[f"{spec.name}_sum"] += observations * spec.observe
            covering = sum(1 for b in spec.buckets if b >= spec.observe) + 1  # with +Inf
            sums[f"{spec.name}_bucket"] += observations * covering
        elif spec.mode == "sum":
            sums[spec.name] += processes * combos * _gauge_value(spec, 0, ticks)
        else:
            sums[spec.name] += combos * sum(_gauge_value(spec, e, ticks) for e in engines)
    return dict(sums)


def main() -> None:
    """Serve ``tick``/``exit`` commands from stdin until told to stop."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--index", type=int, required=True)
    args = parser.parse_args()
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        sys.exit("PROMETHEUS_MULTIPROC_DIR is not set")
    metrics = create_metrics()
    tick = 0
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "tick":
            tick += 1
            apply_tick(metrics, args.index, tick)
        elif command == "exit":
            break
        print("ok", flush=True)


if __name__ == "__main__":
    main()
