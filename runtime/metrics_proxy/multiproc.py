"""Reads vLLM's ``prometheus_client`` multiprocess ``.db`` files into merged metric families.

It merges exactly as ``prometheus_client.multiprocess.MultiProcessCollector`` does (counters,
histogram buckets and sums add up across processes; gauges follow their multiprocess mode),
but file by file: memory grows with the number of distinct series, not with the number of
files, and a truncated or corrupt file is skipped and reported instead of failing the scrape.
"""

from __future__ import annotations

import json
import os
import struct
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.utils import floatToGoString

from runtime.metrics_proxy.exposition import Family, LabelSet, Sample

__all__ = ["MultiprocReader", "MultiprocResult"]

_INT = struct.Struct("i")
_TWO_DOUBLES = struct.Struct("dd")
_HEADER = 8
_READ_CHUNK = 1 << 16
# Distinct keys seen across all files; vLLM's families yield a few thousand. Past this the
# cache is dropped and rebuilt, which bounds memory if labels churn.
_KEY_CACHE_LIMIT = 200_000
_MIN_MODES = ("min", "livemin")
_MAX_MODES = ("max", "livemax")
_SUM_MODES = ("sum", "livesum")
_RECENT_MODES = ("mostrecent", "livemostrecent")

_ParsedKey = tuple[str, str, LabelSet, str]


class _CorruptFile(ValueError):
    pass


@dataclass(frozen=True)
class MultiprocResult:
    """Merged families plus what the read found: files read and files skipped as corrupt."""

    families: list[Family]
    files: int
    corrupt_files: tuple[str, ...]


class _Accumulator:
    """Running merge of all files' entries, as ``MultiProcessCollector._accumulate_metrics``."""

    def __init__(self) -> None:
        self.meta: dict[str, tuple[str, str]] = {}
        self.sums: dict[str, dict[tuple[str, LabelSet], float]] = defaultdict(dict)
        self.buckets: dict[str, dict[LabelSet, dict[float, float]]] = defaultdict(dict)
        self.gauges: dict[str, dict[tuple[str, LabelSet], tuple[float, float]]] = defaultdict(dict)

    def add_file(
        self, typ: str, mode: str, pid: str, entries: list[tuple[_ParsedKey, float, float]]
    ) -> None:
        for (metric, sample, labels, help_text), value, timestamp in entries:
            known = self.meta.setdefault(metric, (typ, help_text))
            typ_of_metric = known[0]
            if typ_of_metric == "gauge":
                self._add_gauge(metric, mode, pid, sample, labels, value, timestamp)
            elif typ_of_metric == "histogram" and labels and any(k == "le" for k, _ in labels):
                without_le = tuple(kv for kv in labels if kv[0] != "le")
                le = float(next(v for k, v in labels if k == "le"))
                per_le = self.buckets[metric].setdefault(without_le, {})
                per_le[le] = per_le.get(le, 0.0) + value
            else:
                series = self.sums[metric]
                series[(sample, labels)] = series.get((sample, labels), 0.0) + value

    def _add_gauge(
        self,
        metric: str,
        mode: str,
        pid: str,
        sample: str,
        labels: LabelSet,
        value: float,
        timestamp: float,
    ) -> None:
        series = self.gauges[metric]
        if mode in _RECENT_MODES:
            # As prometheus_client: a gauge never set (timestamp 0) is not exposed.
            key = (sample, labels)
            current = series.get(key)
            if timestamp > (0.0 if current is None else current[1]):
                series[key] = (value, timestamp)
        elif mode in _MIN_MODES + _MAX_MODES + _SUM_MODES:
            key = (sample, labels)
            current = series.get(key)
            if current is None:
                series[key] = (value, timestamp)
            elif mode in _MIN_MODES:
                series[key] = (min(current[0], value), 0.0)
            elif mode in _MAX_MODES:
                series[key] = (max(current[0], value), 0.0)
            else:
                series[key] = (current[0] + value, 0.0)
        else:  # all / liveall: one series per process, told apart by a pid label
            series[(sample, (*labels, ("pid", pid)))] = (value, timestamp)

    def families(self) -> list[Family]:
        out = []
        for metric, (typ, help_text) in self.meta.items():
            fam = Family(metric, typ, help_text)
            if typ == "gauge":
                fam.samples = [
                    Sample(name, labels, value)
                    for (name, labels), (value, _) in self.gauges[metric].items()
                ]
            elif typ == "histogram":
                fam.samples = self._histogram_samples(metric)
            else:
                fam.samples = [
                    Sample(name, labels, value)
                    for (name, labels), value in self.sums[metric].items()
                ]
            out.append(fam)
        return out

    def _histogram_samples(self, metric: str) -> list[Sample]:
        samples: list[Sample] = []
        sums = self.sums.get(metric, {})
        for labels, per_le in self.buckets[metric].items():
            acc = 0.0
            for le, value in sorted(per_le.items()):
                acc += value
                samples.append(
                    Sample(f"{metric}_bucket", (*labels, ("le", floatToGoString(le))), acc)
                )
            samples.append(Sample(f"{metric}_count", labels, acc))
            total = sums.get((f"{metric}_sum", labels))
            if total is not None:
                samples.append(Sample(f"{metric}_sum", labels, total))
        return samples


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read(_READ_CHUNK)
        if len(data) < _HEADER:
            raise _CorruptFile(f"{len(data)} bytes, shorter than the 8-byte header")
        used = _INT.unpack_from(data, 0)[0]
        if used > len(data):
            data += f.read(used - len(data))
    if used < _HEADER or used > len(data):
        raise _CorruptFile(f"header says {used} bytes used, file holds {len(data)}")
    return data[:used]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class MultiprocReader:
    """Merges a ``PROMETHEUS_MULTIPROC_DIR``; keeps only a cache of parsed keys between reads.

    Values are re-read on every call: ``mmap`` writes do not reliably update a file's mtime,
    so a cache keyed on mtime would serve stale counters.
    """

    def __init__(self, directory: Path, mark_dead_processes: bool = False) -> None:
        self._directory = directory
        self._mark_dead = mark_dead_processes
        self._keys: dict[bytes, _ParsedKey] = {}

    def _parse_key(self, raw: bytes) -> _ParsedKey:
        parsed = self._keys.get(raw)
        if parsed is None:
            try:
                metric, sample, labels, help_text = json.loads(raw)
                labels_key = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
            except (ValueError, TypeError, AttributeError) as exc:
                raise _CorruptFile(f"undecodable key: {exc}") from exc
            if len(self._keys) >= _KEY_CACHE_LIMIT:
                self._keys.clear()
            parsed = self._keys[raw] = (str(metric), str(sample), labels_key, str(help_text))
        return parsed

    def _entries(self, data: bytes) -> list[tuple[_ParsedKey, float, float]]:
        entries = []
        pos, used = _HEADER, len(data)
        while pos < used:
            if pos + 4 > used:
                raise _CorruptFile(f"entry header cut at byte {pos}")
            length = _INT.unpack_from(data, pos)[0]
            padded = length + (8 - (length + 4) % 8)
            end = pos + 4 + padded + 16
            if length <= 0 or end > used:
                raise _CorruptFile(f"entry at byte {pos} runs past the used size {used}")
            key = self._parse_key(data[pos + 4 : pos + 4 + length])
            value, timestamp = _TWO_DOUBLES.unpack_from(data, pos + 4 + padded)
            entries.append((key, value, timestamp))
            pos = end
        return entries

    def _mark_dead_processes(self, names: list[str]) -> None:
        pids = {
            name.rsplit("_", 1)[1][:-3]
            for name in names
            if name.startswith("gauge_live") and name.count("_") == 2
        }
        for pid in pids:
            if pid.isdigit() and not _pid_alive(int(pid)):
                mark_process_dead(int(pid), str(self._directory))

    def read(self) -> MultiprocResult:
        """Merge every ``*.db`` file; raises ``OSError`` only if the directory is unreadable."""
        names = [e.name for e in os.scandir(self._directory) if e.name.endswith(".db")]
        if self._mark_dead:
            self._mark_dead_processes(names)
            names = [n for n in names if os.path.exists(os.path.join(self._directory, n))]
        acc = _Accumulator()
        corrupt: list[str] = []
        read = 0
        for name in sorted(names):
            parts = name[:-3].split("_")
            typ = parts[0]
            mode = parts[1] if typ == "gauge" and len(parts) == 3 else ""
            pid = parts[-1]
            try:
                entries = self._entries(_read_file(os.path.join(self._directory, name)))
            except FileNotFoundError:
                # Removed between listing and reading: mark_process_dead or a wipe.
                continue
            except (_CorruptFile, OSError) as exc:
                corrupt.append(f"{name}: {exc}")
                continue
            read += 1
            acc.add_file(typ, mode, pid, entries)
        return MultiprocResult(acc.families(), read, tuple(corrupt))
