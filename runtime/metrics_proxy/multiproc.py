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
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.utils import floatToGoString

from runtime.metrics_proxy.exposition import Family, LabelSet, Sample

__all__ = ["MultiprocReader", "MultiprocResult"]

_INT = struct.Struct("i")
_HEADER = 8
_READ_CHUNK = 1 << 16
# Distinct layouts and series seen across reads; vLLM yields a few of the first and a few
# thousand of the second. Past these limits the caches are rebuilt, bounding memory.
_LAYOUT_LIMIT = 1_000
_SLOT_LIMIT = 200_000
_MIN_MODES = ("min", "livemin")
_MAX_MODES = ("max", "livemax")
_SUM_MODES = ("sum", "livesum")
_RECENT_MODES = ("mostrecent", "livemostrecent")

_ParsedKey = tuple[str, str, LabelSet, str]
"""(metric name, sample name, sorted labels, help) as prometheus_client's mmap key holds them."""


class _CorruptFile(ValueError):
    pass


@dataclass(frozen=True)
class MultiprocResult:
    """Merged families plus what the read found: files read and files skipped as corrupt."""

    families: list[Family]
    files: int
    corrupt_files: tuple[str, ...]


@dataclass
class _Layout:
    """The key part of one file, which only ever grows: checked in one C call per read.

    ``keys_of`` unpacks every key from a file of the same size; if they equal ``keys``,
    ``values_of`` unpacks all (value, timestamp) pairs at once.
    """

    keys: tuple[bytes, ...]
    parsed: list[_ParsedKey]
    keys_of: struct.Struct
    values_of: struct.Struct
    plans: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Slot:
    """One summed series; a histogram bucket keeps its ``le`` apart from its labels."""

    metric: str
    sample: str
    labels: LabelSet
    le: float | None


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


def _parse_key(raw: bytes) -> _ParsedKey:
    try:
        metric, sample, labels, help_text = json.loads(raw)
        labels_key = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
    except (ValueError, TypeError, AttributeError) as exc:
        raise _CorruptFile(f"undecodable key: {exc}") from exc
    return str(metric), str(sample), labels_key, str(help_text)


def _build_layout(data: bytes) -> _Layout:
    keys: list[bytes] = []
    key_fmt, value_fmt = ["=8x"], ["=8x"]
    pos, used = _HEADER, len(data)
    while pos < used:
        if pos + 4 > used:
            raise _CorruptFile(f"entry header cut at byte {pos}")
        length = _INT.unpack_from(data, pos)[0]
        padded = length + (8 - (length + 4) % 8)
        end = pos + 4 + padded + 16
        if length <= 0 or end > used:
            raise _CorruptFile(f"entry at byte {pos} runs past the used size {used}")
        keys.append(data[pos + 4 : pos + 4 + length])
        key_fmt.append(f"4x{length}s{padded - length + 16}x")
        value_fmt.append(f"{4 + padded}xdd")
        pos = end
    return _Layout(
        keys=tuple(keys),
        parsed=[_parse_key(k) for k in keys],
        keys_of=struct.Struct("".join(key_fmt)),
        values_of=struct.Struct("".join(value_fmt)),
    )


class _Merge:
    """One read's running merge, as ``MultiProcessCollector._accumulate_metrics`` merges."""

    def __init__(self, slots: list[_Slot]) -> None:
        self.slots = slots
        self.totals: list[float] = []
        self.touched: set[int] = set()
        self.gauges: dict[str, dict[tuple[str, LabelSet], tuple[float, float]]] = {}

    def add_sums(self, plan: list[int], values: tuple[float, ...]) -> None:
        totals = self.totals
        if len(totals) < len(self.slots):
            totals.extend([0.0] * (len(self.slots) - len(totals)))
        for slot, value in zip(plan, values[0::2], strict=True):
            totals[slot] += value

    def add_gauges(
        self, parsed: list[_ParsedKey], values: tuple[float, ...], mode: str, pid: str
    ) -> None:
        for (metric, sample, labels, _), value, timestamp in zip(
            parsed, values[0::2], values[1::2], strict=True
        ):
            series = self.gauges.setdefault(metric, {})
            if mode in _RECENT_MODES:
                # As prometheus_client: a gauge never set (timestamp 0) is not exposed.
                current = series.get((sample, labels))
                if timestamp > (0.0 if current is None else current[1]):
                    series[(sample, labels)] = (value, timestamp)
            elif mode in _MIN_MODES + _MAX_MODES + _SUM_MODES:
                current = series.get((sample, labels))
                if current is None:
                    series[(sample, labels)] = (value, timestamp)
                elif mode in _MIN_MODES:
                    series[(sample, labels)] = (min(current[0], value), 0.0)
                elif mode in _MAX_MODES:
                    series[(sample, labels)] = (max(current[0], value), 0.0)
                else:
                    series[(sample, labels)] = (current[0] + value, 0.0)
            else:  # all / liveall: one series per process, told apart by a pid label
                series[(sample, (*labels, ("pid", pid)))] = (value, timestamp)

    def families(self, meta: dict[str, tuple[str, str]]) -> list[Family]:
        out: dict[str, Family] = {}

        def family(metric: str) -> Family:
            fam = out.get(metric)
            if fam is None:
                typ, help_text = meta[metric]
                fam = out[metric] = Family(metric, typ, help_text)
            return fam

        buckets: dict[tuple[str, LabelSet], list[tuple[float, float]]] = {}
        sums: dict[tuple[str, LabelSet], float] = {}
        for index in sorted(self.touched):
            slot, total = self.slots[index], self.totals[index]
            if slot.le is not None:
                buckets.setdefault((slot.metric, slot.labels), []).append((slot.le, total))
            elif meta[slot.metric][0] == "histogram":
                # Only _sum is kept: _count is the bucket total, as prometheus_client makes it.
                if slot.sample == f"{slot.metric}_sum":
                    sums[(slot.metric, slot.labels)] = total
                family(slot.metric)
            else:
                family(slot.metric).samples.append(Sample(slot.sample, slot.labels, total))
        for (metric, labels), per_le in buckets.items():
            samples = family(metric).samples
            acc = 0.0
            for le, value in sorted(per_le):
                acc += value
                samples.append(
                    Sample(f"{metric}_bucket", (*labels, ("le", floatToGoString(le))), acc)
                )
            samples.append(Sample(f"{metric}_count", labels, acc))
            total = sums.get((metric, labels))
            if total is not None:
                samples.append(Sample(f"{metric}_sum", labels, total))
        for metric, series in self.gauges.items():
            family(metric).samples.extend(
                Sample(name, labels, value) for (name, labels), (value, _) in series.items()
            )
        return list(out.values())


class MultiprocReader:
    """Merges a ``PROMETHEUS_MULTIPROC_DIR``, re-reading every value on every call.

    Values cannot be cached: ``mmap`` writes do not reliably update a file's mtime. What is
    cached is each file's key layout (verified against the file's bytes on every read) and
    the summed series, so a read costs a few C calls per file plus one add per entry.
    """

    def __init__(self, directory: Path, mark_dead_processes: bool = False) -> None:
        self._directory = directory
        self._mark_dead = mark_dead_processes
        self._layouts: dict[tuple[bytes, ...], _Layout] = {}
        self._file_layouts: dict[str, _Layout] = {}
        self._slots: list[_Slot] = []
        self._slot_index: dict[_Slot, int] = {}
        self._meta: dict[str, tuple[str, str]] = {}

    def _layout(self, name: str, data: bytes) -> _Layout:
        layout = self._file_layouts.get(name)
        if (
            layout is not None
            and layout.keys_of.size == len(data)
            and layout.keys_of.unpack_from(data) == layout.keys
        ):
            return layout
        built = _build_layout(data)
        if len(self._layouts) >= _LAYOUT_LIMIT:
            self._layouts.clear()
        layout = self._layouts.setdefault(built.keys, built)
        self._file_layouts[name] = layout
        return layout

    def _slot(self, slot: _Slot) -> int:
        index = self._slot_index.get(slot)
        if index is None:
            index = self._slot_index[slot] = len(self._slots)
            self._slots.append(slot)
        return index

    def _plan(self, layout: _Layout, typ: str) -> list[int]:
        plan = layout.plans.get(typ)
        if plan is None:
            plan = []
            for metric, sample, labels, _ in layout.parsed:
                le = next((v for k, v in labels if k == "le"), None)
                if typ == "histogram" and le is not None:
                    without_le = tuple(kv for kv in labels if kv[0] != "le")
                    slot = _Slot(metric, f"{metric}_bucket", without_le, float(le))
                else:
                    slot = _Slot(metric, sample, labels, None)
                plan.append(self._slot(slot))
            layout.plans[typ] = plan
        return plan

    def _mark_dead_processes(self, names: list[str]) -> None:
        pids = {
            name.rsplit("_", 1)[1][:-3]
            for name in names
            if name.startswith("gauge_live") and name.count("_") == 2
        }
        for pid in pids:
            if pid.isdigit() and not _pid_alive(int(pid)):
                mark_process_dead(int(pid), str(self._directory))

    def _reset_if_large(self) -> None:
        if len(self._slots) > _SLOT_LIMIT:
            self._slots, self._slot_index = [], {}
            self._layouts, self._file_layouts = {}, {}

    def read(self) -> MultiprocResult:
        """Merge every ``*.db`` file; raises ``OSError`` only if the directory is unreadable."""
        names = sorted(e.name for e in os.scandir(self._directory) if e.name.endswith(".db"))
        if self._mark_dead:
            self._mark_dead_processes(names)
            names = [n for n in names if os.path.exists(os.path.join(self._directory, n))]
        self._reset_if_large()
        # Forget files that are gone so the per-file map stays as large as the directory.
        self._file_layouts = {n: self._file_layouts[n] for n in names if n in self._file_layouts}
        merge = _Merge(self._slots)
        corrupt: list[str] = []
        read = 0
        for name in names:
            parts = name[:-3].split("_")
            typ, pid = parts[0], parts[-1]
            try:
                data = _read_file(os.path.join(self._directory, name))
                layout = self._layout(name, data)
            except FileNotFoundError:
                continue  # removed between listing and reading: mark_process_dead or a wipe
            except (_CorruptFile, OSError) as exc:
                corrupt.append(f"{name}: {exc}")
                continue
            read += 1
            values = layout.values_of.unpack_from(data)
            for metric, _, _, help_text in layout.parsed:
                if metric not in self._meta:
                    self._meta[metric] = (typ, help_text)
            if typ == "gauge":
                mode = parts[1] if len(parts) == 3 else "all"
                merge.add_gauges(layout.parsed, values, mode, pid)
            else:
                plan = self._plan(layout, typ)
                merge.add_sums(plan, values)
                merge.touched.update(plan)
        return MultiprocResult(merge.families(self._meta), read, tuple(corrupt))
