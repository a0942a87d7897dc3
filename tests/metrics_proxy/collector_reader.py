"""vLLM's multiprocess ``.db`` files merged by ``prometheus_client``'s ``MultiProcessCollector``,
behind the proxy's reader interface: what the benchmark and the tests set beside the proxy's
own reader (``runtime.metrics_proxy.multiproc.MultiprocReader``).

The collector fails a whole merge over one unreadable file; here a file that does not read
(cut short, damaged) is left out and named instead, and the rest are merged as usual.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from runtime.metrics_proxy.multiproc import MultiprocResult, mark_dead_processes

__all__ = ["CollectorReader", "collector_view"]


def _merge(paths: list[str]) -> list[Metric]:
    return list(MultiProcessCollector.merge(paths, accumulate=True))


class CollectorReader:
    """Reads a ``PROMETHEUS_MULTIPROC_DIR`` whole on every call (``mmap`` writes need not
    change a file's mtime, so nothing can be cached)."""

    def __init__(self, directory: Path, mark_dead_processes: bool = False) -> None:
        self._directory = directory
        self._mark_dead = mark_dead_processes
        # Files found corrupt, by name, with the (size, mtime) they had: skipped unread while
        # unchanged, so one bad file does not double every later merge.
        self._corrupt: dict[str, tuple[int, int]] = {}

    def read(self) -> MultiprocResult:
        """Merge every ``*.db`` file; raises ``OSError`` only if the directory is unreadable."""
        names = sorted(e.name for e in os.scandir(self._directory) if e.name.endswith(".db"))
        if self._mark_dead:
            names = mark_dead_processes(self._directory, names)
        known_bad = [n for n in names if n in self._corrupt and self._unchanged(n)]
        readable = [n for n in names if n not in known_bad]
        try:
            families = _merge(self._paths(readable))
        except Exception:  # any file that does not parse fails the collector's whole merge
            readable = self._readable(readable)
            families = _merge(self._paths(readable))
        self._corrupt = {n: self._corrupt[n] for n in known_bad} | {
            n: sig for n in names if n not in readable and (sig := self._signature(n))
        }
        corrupt = tuple(n for n in names if n in self._corrupt)
        return MultiprocResult(families, len(readable), corrupt)

    def _paths(self, names: list[str]) -> list[str]:
        return [os.path.join(self._directory, n) for n in names]

    def _readable(self, names: list[str]) -> list[str]:
        """The names that the collector reads one by one; removed files are left out too."""
        good = []
        for name in names:
            try:
                _merge(self._paths([name]))
            except FileNotFoundError:
                continue  # removed since the listing (a wipe, mark_process_dead)
            except Exception:
                continue
            good.append(name)
        return good

    def _signature(self, name: str) -> tuple[int, int] | None:
        try:
            st = os.stat(os.path.join(self._directory, name))
        except FileNotFoundError:
            return None  # gone: not corrupt, just removed
        return st.st_size, st.st_mtime_ns

    def _unchanged(self, name: str) -> bool:
        return self._signature(name) == self._corrupt[name]


def collector_view(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample ``MultiProcessCollector`` merges from ``directory``, by name and labels."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in registry.collect()
        for s in metric.samples
    }
