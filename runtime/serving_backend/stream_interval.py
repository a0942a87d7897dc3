"""vLLM's ``stream_interval`` for the streamed responses of the stock backend.

vLLM batches several tokens into one streamed output when the engine argument
``stream_interval`` (or a request's ``SamplingParams.stream_interval``, clamped up to it) is
above 1, cutting the per-response cost of every process downstream. vLLM 0.27.1 applies it only
to ``RequestOutputKind.DELTA`` outputs; the stock backend asks for cumulative ones, so under
Triton the setting silently did nothing. `IntervalGate` applies the same rule to cumulative
outputs: the first output, a finished one, and one at least ``interval`` tokens past the last
one handed on go out; the others are skipped, and the next one sent carries their tokens.

Importable outside Triton's stub (no ``triton_python_backend_utils``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["IntervalGate", "engine_stream_interval", "request_stream_interval"]


def engine_stream_interval(generate: Any) -> int:
    """The engine-level ``stream_interval`` of the ``AsyncLLM`` whose bound ``generate`` the
    stock backend calls; 1 where the engine has none (vLLM before the setting existed)."""
    engine = getattr(generate, "__self__", None)
    scheduler = getattr(getattr(engine, "vllm_config", None), "scheduler_config", None)
    value = getattr(scheduler, "stream_interval", 1)
    return value if isinstance(value, int) and value >= 1 else 1


def request_stream_interval(sampling_params: Any, engine_interval: int) -> int:
    """A request's interval: its own ``stream_interval`` clamped up to the engine's, as vLLM
    clamps it."""
    own = getattr(sampling_params, "stream_interval", None)
    return max(own, engine_interval) if isinstance(own, int) else engine_interval


class IntervalGate:
    """Decides which of one request's cumulative outputs to hand on."""

    def __init__(self, interval: int) -> None:
        if interval < 1:
            raise ValueError(f"stream_interval must be at least 1, got {interval}")
        self.interval = interval
        self._sent: int | None = None

    def due(self, request_output: Any) -> bool:
        """Whether ``request_output`` goes out (and counts as sent); with ``n`` choices, the
        choice furthest along decides."""
        if self.interval == 1:
            return True
        tokens = max((len(o.token_ids) for o in request_output.outputs), default=0)
        if self._sent is None or request_output.finished or tokens - self._sent >= self.interval:
            self._sent = tokens
            return True
        return False
