"""Prometheus counters of the constraint processors: dead ends and requests rejected in a batch.

With ``PROMETHEUS_MULTIPROC_DIR`` set (the serving pod sets it before vLLM's processes start),
prometheus_client writes every value to that folder, which the metrics proxy merges into its
``/metrics``; the registry here is private so that nothing registers the names twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

__all__ = [
    "DEAD_ENDS_TOTAL",
    "REJECTED_REQUESTS_TOTAL",
    "ConstraintCounters",
    "CounterSync",
    "process_counters",
]

DEAD_ENDS_TOTAL = "llm_serving_constraint_dead_ends_total"
REJECTED_REQUESTS_TOTAL = "llm_serving_constraint_rejected_requests_total"


class _Totals(Protocol):
    @property
    def total_dead_ends(self) -> int: ...

    @property
    def rejected_requests(self) -> int: ...


@dataclass(frozen=True)
class ConstraintCounters:
    """The two counters of one process."""

    dead_ends: Counter
    rejected_requests: Counter


@lru_cache(maxsize=1)
def process_counters() -> ConstraintCounters:
    """The process's counters, created once: a second pair under the same names would
    overwrite the first's values in the process's multiprocess file."""
    registry = CollectorRegistry()
    return ConstraintCounters(
        dead_ends=Counter(
            DEAD_ENDS_TOTAL,
            "Decoding steps at which a constraint allowed nothing and forced its terminator or EOS",
            registry=registry,
        ),
        rejected_requests=Counter(
            REJECTED_REQUESTS_TOTAL,
            "Constrained requests whose configuration failed when they joined the batch "
            "(they end instead of running unconstrained)",
            registry=registry,
        ),
    )


@dataclass
class CounterSync:
    """Adds what a batch's running totals grew by since the previous call to the counters."""

    counters: ConstraintCounters = field(default_factory=process_counters)
    _dead_ends: int = 0
    _rejected: int = 0

    def __call__(self, batch: _Totals) -> None:
        dead_ends, rejected = batch.total_dead_ends, batch.rejected_requests
        if dead_ends > self._dead_ends:
            self.counters.dead_ends.inc(dead_ends - self._dead_ends)
            self._dead_ends = dead_ends
        if rejected > self._rejected:
            self.counters.rejected_requests.inc(rejected - self._rejected)
            self._rejected = rejected
