"""The KEDA Prometheus trigger of a model service: the query for its scaling metric and how the
HPA reads the value (a total to share out per pod, or a level to hold)."""

from __future__ import annotations

from typing import Any

from components.model_service.args import ScalingTrigger

__all__ = ["RATE_WINDOW", "prometheus_trigger", "scaling_query"]

# Four scrapes of the 15 s scrape interval: enough samples for rate(), fresh enough to scale on.
RATE_WINDOW = "1m"


def scaling_query(metric: str, matchers: str) -> str:
    """The PromQL of ``metric`` (see :data:`~components.model_service.args.SCALING_METRICS`)
    over the series that ``matchers`` (``model_id="m",model_version="v"``) select."""
    if metric == "queue_size":
        return f"sum(vllm:num_requests_waiting{{{matchers}}})"
    if metric == "inference_rate":
        return f"sum(rate(nv_inference_count{{{matchers}}}[{RATE_WINDOW}]))"
    if metric == "queue_time_us":
        # Queue time per request over the window; without requests the division by an empty
        # vector is empty (not NaN, which KEDA cannot scale on) and reads as no queue at all.
        return (
            f"(sum(rate(nv_inference_queue_duration_us{{{matchers}}}[{RATE_WINDOW}]))"
            f" / (sum(rate(nv_inference_request_success{{{matchers}}}[{RATE_WINDOW}])) > 0))"
            " or vector(0)"
        )
    raise ValueError(f"unsupported scaling metric {metric!r}")


def prometheus_trigger(trigger: ScalingTrigger, matchers: str, server: str) -> dict[str, Any]:
    """The ScaledObject trigger for ``trigger`` against the Prometheus at ``server``."""
    # Queue size and inference rate are totals over the pods, shared out per pod
    # (AverageValue); queue time is already an average, held at the target as a level (Value:
    # desired pods = current pods x value / target).
    metric_type = "Value" if trigger.metric == "queue_time_us" else "AverageValue"
    return {
        "type": "prometheus",
        "metricType": metric_type,
        "metadata": {
            "serverAddress": server,
            "query": scaling_query(trigger.metric, matchers),
            "threshold": str(trigger.target),
        },
    }
