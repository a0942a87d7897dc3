"""Reads vLLM's ``prometheus_client`` multiprocess ``.db`` files into merged metric families.

It merges exactly as ``prometheus_client.multiprocess.MultiProcessCollector`` does (counters,
histogram buckets and sums add up across processes; gauges follow their multiprocess mode),
but file by file: memory grows with the number of distinct series, not with the number of
files, and a truncated or corrupt file is skipped and reported instead of failing the scrape.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.utils import floatToGoString

from runtime.metrics_proxy.exposition import Family, LabelSet, Layout, Sample

__all__ = ["MultiprocReader", "MultiprocResult"]

_INT = struct.Struct("i")
_HEADER = 8
_READ_CHUNK = 1 << 16
# Distinct layouts and series seen across reads; vLLM yields a few of the first and a few
# thousand of the second. Past these limits the caches are rebuilt, bounding memory.
_LAYOUT_LIMIT = 1_000
_SLOT_LIMIT = 200_000
# Files kept mapped between reads (each holds a descriptor); files past this many are read.
_MAPPED_LIMIT = 256
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
    """The merge as a layout and its values, plus files read and files skipped as corrupt.

    ``layout`` is the same object from read to read while the set of series is unchanged.
    """

    layout: Layout
    values: list[float]
    files: int
    corrupt_files: tuple[str, ...]

    @property
    def families(self) -> list[Family]:
        """The merged families with their values."""
        return self.layout.fill(self.values)


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
    plans: dict[str, np.ndarray] = field(default_factory=dict)
    described: set[str] = field(default_factory=set)

    @property
    def series(self) -> list[tuple[str, tuple[str, LabelSet]]]:
        """Per entry, its metric and its (sample name, labels): how gauges are merged."""
        if self._series is None:
            self._series = [(metric, (sample, labels)) for metric, sample, labels, _ in self.parsed]
        return self._series

    _series: list[tuple[str, tuple[str, LabelSet]]] | None = None

    def matches(self, words: np.ndarray) -> bool:
        return len(words) * 8 == self.size and np.array_equal(words[self.key_idx], self.key_words)


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
    if used % 8:
        raise _CorruptFile(f"used size {used} is not a multiple of 8, as every entry is")
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
        self.plans: dict[int, np.ndarray] = {}
        self.gauges: dict[str, dict[tuple[str, LabelSet], tuple[float, float]]] = {}

    def add_sums(self, plan: np.ndarray, values: np.ndarray) -> None:
        if len(self.totals) < len(self.slots):
            self.totals = np.concatenate(
                [self.totals, np.zeros(len(self.slots) - len(self.totals))]
            )
        # A key appears once per file, so the plan's slots are distinct: no np.add.at needed.
        self.totals[plan] += values
        self.plans[id(plan)] = plan

    def add_gauges(self, layout: _Layout, words: np.ndarray, mode: str, pid: str) -> None:
        values = words[layout.value_idx].tolist()
        if mode in _RECENT_MODES:
            stamps = words[layout.value_idx + 1].tolist()
            for (metric, key), value, timestamp in zip(layout.series, values, stamps, strict=True):
                series = self.gauges.setdefault(metric, {})
                # As prometheus_client: a gauge never set (timestamp 0) is not exposed.
                current = series.get(key)
                if timestamp > (0.0 if current is None else current[1]):
                    series[key] = (value, timestamp)
        elif mode in _MIN_MODES + _MAX_MODES + _SUM_MODES:
            for (metric, key), value in zip(layout.series, values, strict=True):
                series = self.gauges.setdefault(metric, {})
                current = series.get(key)
                if current is None:
                    series[key] = (value, 0.0)
                elif mode in _MIN_MODES:
                    series[key] = (min(current[0], value), 0.0)
                elif mode in _MAX_MODES:
                    series[key] = (max(current[0], value), 0.0)
                else:
                    series[key] = (current[0] + value, 0.0)
        else:  # all / liveall: one series per process, told apart by a pid label
            for (metric, (sample, labels)), value in zip(layout.series, values, strict=True):
                self.gauges.setdefault(metric, {})[(sample, (*labels, ("pid", pid)))] = (value, 0.0)

    def gauge_shape(self) -> tuple[tuple[str, tuple[tuple[str, LabelSet], ...]], ...]:
        return tuple((metric, tuple(series)) for metric, series in self.gauges.items())

    def values(self, plan: _RenderPlan) -> list[float]:
        """The merged values in the order of ``plan.layout``'s positions."""
        summed = np.append(self.totals, 0.0)[plan.gather]  # -1 picks that 0: a _count
        if len(plan.cumulative):
            counts = summed[plan.cumulative]
            running = np.cumsum(counts)
            # Restart the running sum at each series' first bucket. Exact: bucket values are
            # whole counts, so the subtraction loses nothing while they stay under 2**53.
            before = np.concatenate(([0.0], running))[plan.restart]
            summed[plan.cumulative] = running - before
        values = summed.tolist()
        for series in self.gauges.values():
            values.extend(value for value, _ in series.values())
        return values


@dataclass(frozen=True, eq=False)
class _RenderPlan:
    """How summed slots and merged gauges become the layout's values."""

    layout: Layout
    gather: np.ndarray  # per summed position: its slot, or -1 for a _count
    cumulative: np.ndarray  # positions of buckets and counts, each series' run in le order
    restart: np.ndarray  # per cumulative position: where its series' run starts


def _render_plan(
    touched: np.ndarray,
    slots: list[_Slot],
    meta: dict[str, tuple[str, str]],
    gauges: tuple[tuple[str, tuple[tuple[str, LabelSet], ...]], ...],
) -> _RenderPlan:
    """Samples in the order ``_accumulate_metrics`` gives them, then the gauges."""
    plain: dict[str, list[tuple[str, LabelSet, int]]] = {}
    buckets: dict[tuple[str, LabelSet], list[tuple[float, int]]] = {}
    sums: dict[tuple[str, LabelSet], int] = {}
    for index in touched.tolist():
        slot = slots[index]
        ops = plain.setdefault(slot.metric, [])
        if slot.le is not None:
            buckets.setdefault((slot.metric, slot.labels), []).append((slot.le, index))
        elif meta[slot.metric][0] == "histogram":
            # Only _sum is kept: _count is the bucket total, as prometheus_client makes it.
            if slot.sample == f"{slot.metric}_sum":
                sums[(slot.metric, slot.labels)] = index
        else:
            ops.append((slot.sample, slot.labels, index))
    runs: dict[str, list[tuple[list[tuple[str, LabelSet, int]], tuple[str, LabelSet, int]]]] = {}
    for (metric, labels), per_le in buckets.items():
        run = [
            (f"{metric}_bucket", (*labels, ("le", floatToGoString(le))), index)
            for le, index in sorted(per_le)
        ]
        run.append((f"{metric}_count", labels, -1))
        total = sums.get((metric, labels))
        after = [] if total is None else [(f"{metric}_sum", labels, total)]
        runs.setdefault(metric, []).append((run, after))
    gather: list[int] = []
    cumulative: list[int] = []
    restart: list[int] = []
    families: dict[str, Family] = {}

    def add(fam: Family, name: str, labels: LabelSet, slot: int) -> None:
        fam.samples.append(Sample(name, labels, float(len(gather))))
        gather.append(slot)

    for metric, ops in plain.items():
        fam = families[metric] = Family(metric, *meta[metric])
        for name, labels, slot in ops:
            add(fam, name, labels, slot)
        # Per series: its buckets, its count, its sum, as prometheus_client orders them.
        for run, after in runs.get(metric, ()):
            start = len(cumulative)
            for name, labels, slot in run:
                cumulative.append(len(gather))
                restart.append(start)
                add(fam, name, labels, slot)
            for name, labels, slot in after:
                add(fam, name, labels, slot)
    position = len(gather)
    for metric, series in gauges:
        fam = families.get(metric)
        if fam is None:
            fam = families[metric] = Family(metric, *meta[metric])
        for name, labels in series:
            fam.samples.append(Sample(name, labels, float(position)))
            position += 1
    return _RenderPlan(
        Layout(tuple(families.values())),
        np.array(gather, dtype=np.intp),
        np.array(cumulative, dtype=np.intp),
        np.array(restart, dtype=np.intp),
    )


@dataclass
class _Mapped:
    """A file kept mapped; while it stays mapped its inode cannot be reused by another file,
    so an unchanged inode and used size prove the layout still holds without checking it."""

    inode: int
    mm: mmap.mmap
    layout: _Layout | None = None


def _map(path: str) -> _Mapped | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if st.st_size < _HEADER:
            return None  # nothing to map; the read path reports it
        return _Mapped(st.st_ino, mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ))
    finally:
        os.close(fd)  # mmap keeps its own duplicate


class MultiprocReader:
    """Merges a ``PROMETHEUS_MULTIPROC_DIR``, re-reading every value on every call.

    Values cannot be cached: ``mmap`` writes do not reliably update a file's mtime. What is
    cached is each file's key layout and the summed series' plan; files stay mapped (up to
    ``_MAPPED_LIMIT``), so reading a file's values is one vectorised gather and no system call.
    """

    def __init__(self, directory: Path, mark_dead_processes: bool = False) -> None:
        self._directory = directory
        self._prefix = os.path.join(directory, "")
        self._mark_dead = mark_dead_processes
        self._layouts: dict[tuple[bytes, ...], _Layout] = {}
        self._file_layouts: dict[str, _Layout] = {}
        self._mapped: dict[str, _Mapped] = {}
        self._slots: list[_Slot] = []
        self._slot_index: dict[_Slot, int] = {}
        self._meta: dict[str, tuple[str, str]] = {}
        self._plan_key: tuple[object, ...] = ()
        self._plan_arrays: list[np.ndarray] = []
        self._plan: _RenderPlan | None = None

    def close(self) -> None:
        """Unmap every file."""
        for mapped in self._mapped.values():
            mapped.mm.close()
        self._mapped.clear()

    def _layout(self, name: str, data: bytes, words: np.ndarray) -> _Layout:
        layout = self._file_layouts.get(name)
        if layout is not None and layout.matches(words):
            return layout
        layout = self._shared(_build_layout(data, words))
        self._file_layouts[name] = layout
        return layout

    def _shared(self, built: _Layout) -> _Layout:
        if len(self._layouts) >= _LAYOUT_LIMIT:
            self._layouts.clear()
        return self._layouts.setdefault(built.keys, built)

    def _mapped_words(self, name: str, inode: int, path: str) -> tuple[np.ndarray, _Layout] | None:
        """Values and layout of a mapped file; None when the file is not (or no longer) mapped."""
        mapped = self._mapped.get(name)
        if mapped is not None and (mapped.inode != inode or mapped.mm.size() < len(mapped.mm)):
            # Replaced, or cut short in place: reading past its end would fault.
            mapped.mm.close()
            del self._mapped[name]
            mapped = None
        if mapped is None:
            if len(self._mapped) >= _MAPPED_LIMIT:
                return None
            mapped = _map(path)
            if mapped is None:
                return None
            self._mapped[name] = mapped
        used = _INT.unpack_from(mapped.mm, 0)[0]
        if used > len(mapped.mm):  # the writer grew the file: map it again, whole
            mapped.mm.close()
            del self._mapped[name]
            remapped = _map(path)
            if remapped is None or len(remapped.mm) < used:
                if remapped is not None:
                    remapped.mm.close()
                return None
            mapped = self._mapped[name] = remapped
        if used < _HEADER or used % 8:
            return None  # the read path names what is wrong
        words = np.frombuffer(mapped.mm, dtype=np.float64, count=used // 8)
        layout = mapped.layout
        if layout is None or layout.size != used:
            data = mapped.mm[:used]
            layout = mapped.layout = self._shared(_build_layout(data, words.view(np.uint64)))
        return words, layout

    def _slot(self, slot: _Slot) -> int:
        index = self._slot_index.get(slot)
        if index is None:
            index = self._slot_index[slot] = len(self._slots)
            self._slots.append(slot)
        return index

    def _sum_plan(self, layout: _Layout, typ: str) -> np.ndarray:
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
            layout.plans[typ] = np.array(plan, dtype=np.intp)
        return layout.plans[typ]

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
            for mapped in self._mapped.values():
                mapped.layout = None
            self._plan_key, self._plan = (), None

    def _listing(self) -> list[tuple[str, int]]:
        with os.scandir(self._directory) as entries:
            listing = sorted((e.name, e.inode()) for e in entries if e.name.endswith(".db"))
        if self._mark_dead:
            self._mark_dead_processes([name for name, _ in listing])
            listing = [
                (n, i) for n, i in listing if os.path.exists(os.path.join(self._directory, n))
            ]
        return listing

    def read(self) -> MultiprocResult:
        """Merge every ``*.db`` file; raises ``OSError`` only if the directory is unreadable."""
        listing = self._listing()
        self._reset_if_large()
        names = {name for name, _ in listing}
        # Forget files that are gone so the caches stay as large as the directory, and unmap
        # them so that their space is freed.
        for name in [n for n in self._mapped if n not in names]:
            self._mapped.pop(name).mm.close()
        self._file_layouts = {n: v for n, v in self._file_layouts.items() if n in names}
        merge = _Merge(self._slots)
        corrupt: list[str] = []
        read = 0
        words = None
        for name, inode in listing:
            parts = name[:-3].split("_")
            typ, pid = parts[0], parts[-1]
            path = self._prefix + name
            try:
                got = self._mapped_words(name, inode, path)
                if got is None:
                    data = _read_file(path)
                    words = np.frombuffer(data, dtype=np.float64)
                    layout = self._layout(name, data, words.view(np.uint64))
                else:
                    words, layout = got
            except FileNotFoundError:
                continue  # removed between listing and reading: mark_process_dead or a wipe
            except (_CorruptFile, OSError, ValueError) as exc:
                corrupt.append(f"{name}: {exc}")
                continue
            read += 1
            if typ not in layout.described:
                layout.described.add(typ)
                for metric, _, _, help_text in layout.parsed:
                    self._meta.setdefault(metric, (typ, help_text))
            if typ == "gauge":
                mode = parts[1] if len(parts) == 3 else "all"
                merge.add_gauges(layout, words, mode, pid)
            else:
                merge.add_sums(self._sum_plan(layout, typ), words[layout.value_idx])
        del words  # no view of a mapping may outlive the read: unmapping needs none left
        key = (frozenset(merge.plans), merge.gauge_shape())
        plan = self._plan
        if plan is None or key != self._plan_key:
            plans = list(merge.plans.values())
            touched = np.unique(np.concatenate(plans)) if plans else np.zeros(0, dtype=np.intp)
            plan = self._plan = _render_plan(touched, self._slots, self._meta, key[1])
            # Kept referenced, so no other array can take one of the ids in the key meanwhile.
            self._plan_key, self._plan_arrays = key, plans
        return MultiprocResult(plan.layout, merge.values(plan), read, tuple(corrupt))
