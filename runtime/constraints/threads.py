"""How many worker threads the constraint engine runs: the pod's CPUs, not the node's cores.

A GPU node has far more cores than a serving pod may use (a p5.48xlarge has 192 vCPUs); threads
beyond the pod's CPU quota only queue behind the CFS throttle. The quota is cgroup v2's
``cpu.max`` of the container's own cgroup (the pod's limit), else the CPUs this process may run on.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from runtime.constraints._engine import THREADS_ENV_VAR

__all__ = ["CGROUP_CPU_MAX", "default_num_threads", "pod_cpu_count"]

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
"""cgroup v2's CPU limit of the container's cgroup: ``<quota> <period>``, or ``max <period>``."""


def _quota_cpus(cpu_max: Path) -> int | None:
    """CPUs the ``cpu.max`` quota allows, rounded up; ``None`` without a file or a quota."""
    try:
        quota, _, period = cpu_max.read_text(encoding="ascii").strip().partition(" ")
    except OSError:
        return None
    if quota == "max":
        return None
    try:
        cpus = int(quota) / int(period or "100000")
    except (ValueError, ZeroDivisionError):
        return None  # an unreadable limit must not stop the engine: fall back to affinity
    return max(1, math.ceil(cpus)) if cpus > 0 else None


def pod_cpu_count(
    cpu_max: Path = CGROUP_CPU_MAX,
    affinity: Callable[[int], set[int]] = os.sched_getaffinity,
) -> int:
    """The CPUs this pod may use: the cgroup quota, capped by the CPUs in this process's
    affinity mask (a CPU-pinned pod has both)."""
    allowed = len(affinity(0)) or 1
    quota = _quota_cpus(cpu_max)
    return allowed if quota is None else min(quota, allowed)


def default_num_threads(
    environ: Mapping[str, str] = os.environ,
    cpu_max: Path = CGROUP_CPU_MAX,
    affinity: Callable[[int], set[int]] = os.sched_getaffinity,
) -> int:
    """``LLM_SERVING_ENGINE_THREADS`` when it is a positive whole number (as ``int()`` reads
    it: surrounding spaces and a ``+`` sign allowed), else :func:`pod_cpu_count`."""
    try:
        override = int(environ.get(THREADS_ENV_VAR, ""))
    except ValueError:
        override = 0
    return override if override > 0 else pod_cpu_count(cpu_max, affinity)
