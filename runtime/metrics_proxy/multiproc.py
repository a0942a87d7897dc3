"""Reads vLLM's ``prometheus_client`` multiprocess ``.db`` files into merged metric families.

Why not ``prometheus_client.multiprocess.MultiProcessCollector`` itself: at a pod's scale (eight
writer processes) its read costs about five times this one's CPU, which put the whole proxy at
about 37 ms of CPU per scrape against a budget of 20 (this reader: under 20;
``benchmarks/metrics_proxy.py`` measures both). The tests check this reader against the
collector on every gauge mode and fault.

It merges exactly as ``prometheus_client.multiprocess.MultiProcessCollector`` does (counters,
histogram buckets and sums add up across processes; gauges follow their multiprocess mode),
but file by file: memory grows with the number of distinct series, not with the number of
files, and a truncated or corrupt file is skipped and reported instead of failing the scrape.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

__all__ = [
    "MultiprocReader",
    "MultiprocResult",
    "MultiprocSource",
    "ReaderFactory",
    "mark_dead_processes",
]

log = logging.getLogger(__name__)

LabelSet = tuple[tuple[str, str], ...]
"""Label pairs, sorted as prometheus_client's mmap keys hold them."""

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

    families: list[Metric]
    files: int
    corrupt_files: tuple[str, ...]


class MultiprocSource(Protocol):
    """What the proxy reads vLLM's files with (``MultiprocReader``, or a benchmark's)."""

    def read(self) -> MultiprocResult:
        """Merge the directory's files; raises ``OSError`` if the directory is unreadable."""
        ...


ReaderFactory = Callable[[Path, bool], MultiprocSource]
"""Builds a reader from the directory and whether to mark dead processes."""


@dataclass
class _Layout:
    """Where one file's keys and values lie; files only grow, so keys never move.

    Entries are 8-byte aligned, so the file is read as 64-bit words: ``key_words`` (every
    word that is not a value or a timestamp) must match exactly for the layout to apply,
    then ``value_idx`` picks all values in one vectorised step.
    """

    size: int
    keys: tuple[bytes, ...]
    parsed: list[_ParsedKey]
    key_idx: np.ndarray
    key_words: np.ndarray
    value_idx: np.ndarray
    plans: dict[str, _SumPlan] = field(default_factory=dict)
    described: set[str] = field(default_factory=set)

    def matches(self, words: np.ndarray) -> bool:
        return len(words) * 8 == self.size and np.array_equal(words[self.key_idx], self.key_words)


@dataclass(frozen=True)
class _SumPlan:
    """The summed series each value of a file adds to; ``unique`` when no two share one."""

    slots: np.ndarray
    unique: bool


@dataclass(frozen=True)
class _Slot:
    """One summed series; a histogram bucket keeps its ``le`` apart from its labels."""

    metric: str
    sample: str
    labels: LabelSet
    le: float | None


def _read_file(path: str) -> bytes:
    """The file's used bytes; none while a writer creates it (``MmapedDict`` makes the file,
    sizes it, then writes its header: a read in between finds no series yet)."""
    with open(path, "rb") as f:
        data = f.read(_READ_CHUNK)
        if not data:
            return data
        if len(data) < _HEADER:
            raise _CorruptFile(f"{len(data)} bytes, shorter than the 8-byte header")
        used = _INT.unpack_from(data, 0)[0]
        if used == 0:
            return b""
        if used > len(data):
            data += f.read(used - len(data))
    if used < _HEADER or used > len(data):
        raise _CorruptFile(f"header says {used} bytes used, file holds {len(data)}")
    if used % 8:
        raise _CorruptFile(f"used size {used} is not a multiple of 8, as every entry is")
    return data[:used]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def mark_dead_processes(directory: Path, names: list[str] | None = None) -> list[str]:
    """``mark_process_dead`` for each pid of a ``gauge_live*`` file whose process is gone.

    Only correct when the pod shares one process namespace. Returns the ``.db`` names
    (of ``names``, or of the directory) that are still there.
    """
    if names is None:
        names = sorted(e.name for e in os.scandir(directory) if e.name.endswith(".db"))
    pids = {
        name.rsplit("_", 1)[1][:-3]
        for name in names
        if name.startswith("gauge_live") and name.count("_") == 2
    }
    for pid in pids:
        if pid.isdigit() and not _pid_alive(int(pid)):
            mark_process_dead(int(pid), str(directory))
    return [n for n in names if os.path.exists(os.path.join(directory, n))]


# Outside these the text format 0.0.4 and OpenMetrics 1.0 have no valid name: one such name
# (prometheus_client accepts UTF-8 names) makes a Prometheus 2 scraper reject the whole body.
_NOT_IN_METRIC_NAME = re.compile(r"[^a-zA-Z0-9_:]")
_NOT_IN_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")


def _legacy_name(name: str, invalid: re.Pattern[str]) -> str:
    """``name`` with each character no legacy name may hold made ``_``, as prometheus_client's
    ``underscores`` escaping writes it for scrapers that do not ask for UTF-8 names."""
    name = invalid.sub("_", name)
    return f"_{name}" if not name or name[0].isdigit() else name


# json.loads gives an unpaired "\udXXX" escape of a key (a path decoded with surrogateescape,
# a client's LoRA name) as a lone surrogate, which no UTF-8 body can hold: one such label value
# would fail every scrape's encoding.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8_text(value: object) -> str:
    return _SURROGATE.sub("\ufffd", str(value))


def _parse_key(raw: bytes) -> _ParsedKey:
    try:
        metric, sample, labels, help_text = json.loads(raw)
        labels_key = tuple(
            sorted(
                (_legacy_name(str(k), _NOT_IN_LABEL_NAME), _utf8_text(v)) for k, v in labels.items()
            )
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise _CorruptFile(f"undecodable key: {exc}") from exc
    return (
        _legacy_name(str(metric), _NOT_IN_METRIC_NAME),
        _legacy_name(str(sample), _NOT_IN_METRIC_NAME),
        labels_key,
        _utf8_text(help_text),
    )


def _build_layout(data: bytes, words: np.ndarray) -> _Layout:
    keys: list[bytes] = []
    value_words: list[int] = []
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
        value_words.append((pos + 4 + padded) // 8)
        pos = end
    value_idx = np.array(value_words, dtype=np.intp)
    is_key = np.ones(len(words), dtype=bool)
    is_key[0] = False  # the used-size header changes as the file grows
    is_key[value_idx] = False
    is_key[value_idx + 1] = False
    key_idx = np.flatnonzero(is_key)
    return _Layout(
        size=used,
        keys=tuple(keys),
        parsed=[_parse_key(k) for k in keys],
        key_idx=key_idx,
        key_words=words[key_idx].copy(),
        value_idx=value_idx,
    )


class _Merge:
    """One read's running merge, as ``MultiProcessCollector._accumulate_metrics`` merges."""

    def __init__(self, slots: list[_Slot]) -> None:
        self.slots = slots
        self.totals = np.zeros(len(slots))
        self.touched: set[int] = set()
        self.gauges: dict[str, dict[tuple[str, LabelSet], tuple[float, float]]] = {}

    def add_sums(self, plan: _SumPlan, values: np.ndarray) -> None:
        if len(self.totals) < len(self.slots):
            self.totals = np.concatenate(
                [self.totals, np.zeros(len(self.slots) - len(self.totals))]
            )
        if plan.unique:
            self.totals[plan.slots] += values
        else:
            # Two keys of one file on one series (a name made legal, or two help texts of one
            # metric): both add up, as prometheus_client's collector adds them.
            np.add.at(self.totals, plan.slots, values)

    def add_gauges(
        self,
        parsed: list[_ParsedKey],
        values: list[float],
        stamps: list[float],
        mode: str,
        pid: str,
    ) -> None:
        for (metric, sample, labels, _), value, timestamp in zip(
            parsed, values, stamps, strict=True
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

    def families(self, plan: _RenderPlan, meta: dict[str, tuple[str, str]]) -> list[Metric]:
        totals = self.totals.tolist()
        out: dict[str, Metric] = {}
        for metric, typ, help_text, ops in plan:
            samples = []
            acc = 0.0
            for name, labels, op, slot in ops:
                if op == _PLAIN:
                    value = totals[slot]
                elif op == _BUCKET_FIRST:
                    value = acc = totals[slot]
                elif op == _BUCKET:
                    acc += totals[slot]
                    value = acc
                else:  # _COUNT
                    value = acc
                samples.append(Sample(name, dict(labels), value))
            out[metric] = Metric(metric, help_text, typ)
            out[metric].samples = samples
        for metric, series in self.gauges.items():
            if metric not in out:
                typ, help_text = meta[metric]
                out[metric] = Metric(metric, help_text, typ)
            out[metric].samples.extend(
                Sample(name, dict(labels), value) for (name, labels), (value, _) in series.items()
            )
        return list(out.values())


_PLAIN, _BUCKET_FIRST, _BUCKET, _COUNT = range(4)
_RenderPlan = list[tuple[str, str, str, list[tuple[str, LabelSet, int, int]]]]
"""Per family (name, type, help, ops); each op makes one sample from the summed slots."""


def _render_plan(
    touched: frozenset[int], slots: list[_Slot], meta: dict[str, tuple[str, str]]
) -> _RenderPlan:
    """How to turn summed slots into samples, as ``_accumulate_metrics`` orders them."""
    plain: dict[str, list[tuple[str, LabelSet, int, int]]] = {}
    buckets: dict[tuple[str, LabelSet], list[tuple[float, int]]] = {}
    sums: dict[tuple[str, LabelSet], int] = {}
    for index in sorted(touched):
        slot = slots[index]
        ops = plain.setdefault(slot.metric, [])
        if slot.le is not None:
            buckets.setdefault((slot.metric, slot.labels), []).append((slot.le, index))
        elif meta[slot.metric][0] == "histogram":
            # Only _sum is kept: _count is the bucket total, as prometheus_client makes it.
            if slot.sample == f"{slot.metric}_sum":
                sums[(slot.metric, slot.labels)] = index
        else:
            ops.append((slot.sample, slot.labels, _PLAIN, index))
    for (metric, labels), per_le in buckets.items():
        ops = plain[metric]
        for position, (le, index) in enumerate(sorted(per_le)):
            le_labels = (*labels, ("le", floatToGoString(le)))
            op = _BUCKET_FIRST if position == 0 else _BUCKET
            ops.append((f"{metric}_bucket", le_labels, op, index))
        ops.append((f"{metric}_count", labels, _COUNT, -1))
        if (metric, labels) in sums:
            ops.append((f"{metric}_sum", labels, _PLAIN, sums[(metric, labels)]))
    return [(metric, *meta[metric], ops) for metric, ops in plain.items()]


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
        self._plan_for: tuple[frozenset[int], _RenderPlan] = (frozenset(), [])

    def _layout(self, name: str, data: bytes, words: np.ndarray) -> _Layout:
        layout = self._file_layouts.get(name)
        if layout is not None and layout.matches(words):
            return layout
        built = _build_layout(data, words)
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

    def _plan(self, layout: _Layout, typ: str) -> _SumPlan:
        if typ not in layout.plans:
            plan: list[int] = []
            for metric, sample, labels, _ in layout.parsed:
                le = next((v for k, v in labels if k == "le"), None)
                if typ == "histogram" and le is not None:
                    without_le = tuple(kv for kv in labels if kv[0] != "le")
                    slot = _Slot(metric, f"{metric}_bucket", without_le, float(le))
                else:
                    slot = _Slot(metric, sample, labels, None)
                plan.append(self._slot(slot))
            layout.plans[typ] = _SumPlan(
                np.array(plan, dtype=np.intp), unique=len(set(plan)) == len(plan)
            )
        return layout.plans[typ]

    def _reset_if_large(self) -> None:
        if len(self._slots) > _SLOT_LIMIT:
            self._slots, self._slot_index = [], {}
            self._layouts, self._file_layouts = {}, {}
            self._plan_for = (frozenset(), [])

    def read(self) -> MultiprocResult:
        """Merge every ``*.db`` file; raises ``OSError`` only if the directory is unreadable."""
        names = sorted(e.name for e in os.scandir(self._directory) if e.name.endswith(".db"))
        if self._mark_dead:
            try:
                names = mark_dead_processes(self._directory, names)
            except OSError as exc:
                # A directory this process cannot write (mounted read-only): the dead
                # processes' live gauges stay, as with the setting off, and vLLM's series too.
                log.warning(
                    "cannot remove dead processes' files from %s (%s); "
                    "METRICS_PROXY_MARK_DEAD_PROCESSES is off from now on",
                    self._directory,
                    exc,
                )
                self._mark_dead = False
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
                if not data:
                    if name in self._file_layouts:
                        raise _CorruptFile("emptied after it held series")
                    read += 1  # being created: no series yet
                    continue
                words = np.frombuffer(data, dtype=np.float64)
                layout = self._layout(name, data, words.view(np.uint64))
            except FileNotFoundError:
                continue  # removed between listing and reading: mark_process_dead or a wipe
            except (_CorruptFile, OSError) as exc:
                corrupt.append(f"{name}: {exc}")
                continue
            read += 1
            values = words[layout.value_idx]
            if typ not in layout.described:
                layout.described.add(typ)
                for metric, _, _, help_text in layout.parsed:
                    self._meta.setdefault(metric, (typ, help_text))
            if typ == "gauge":
                mode = parts[1] if len(parts) == 3 else "all"
                stamps = words[layout.value_idx + 1].tolist()
                merge.add_gauges(layout.parsed, values.tolist(), stamps, mode, pid)
            else:
                plan = self._plan(layout, typ)
                merge.add_sums(plan, values)
                merge.touched.update(plan.slots.tolist())
        touched = frozenset(merge.touched)
        if touched != self._plan_for[0]:
            self._plan_for = (touched, _render_plan(touched, self._slots, self._meta))
        families = merge.families(self._plan_for[1], self._meta)
        return MultiprocResult(families, read, tuple(corrupt))
