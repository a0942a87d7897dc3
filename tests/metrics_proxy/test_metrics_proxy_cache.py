"""What the multiprocess readers keep between reads (the collector: the files it found corrupt;
the former Python reader: per-file key layouts and summed series) never hides a change: values,
appended series, replaced, removed, cut and damaged files. Each test runs against the proxy's
reader (``MultiprocReader``) and prometheus_client's ``MultiProcessCollector`` behind the same
interface (``tests/metrics_proxy/collector_reader.py``).

Files are written with ``prometheus_client``'s own ``MmapedDict`` (what its multiprocess
values write through), so each step knows exactly what is on disk; one reader is kept across
the steps as the proxy keeps it across scrapes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from runtime.metrics_proxy.multiproc import MultiprocReader, MultiprocSource
from tests.metrics_proxy.collector_reader import CollectorReader, collector_view


@pytest.fixture(params=["collector", "python_reader"])
def make_reader(request: pytest.FixtureRequest):
    return CollectorReader if request.param == "collector" else MultiprocReader


def _write(path: Path, entries: dict[tuple[str, str, tuple], float], stamp: float = 0.0) -> None:
    """Write ``(metric, sample, labels) -> value`` entries into a ``.db`` file."""
    db = MmapedDict(str(path))
    try:
        for (metric, sample, labels), value in entries.items():
            key = mmap_key(metric, sample, [k for k, _ in labels], [v for _, v in labels], metric)
            db.write_value(key, value, stamp)
    finally:
        db.close()


def _view(reader: MultiprocSource) -> dict[tuple[str, tuple], float]:
    view = {}
    for family in reader.read().families:
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in view, f"duplicate {key}"
            view[key] = s.value
    return view


def _counter(labels: tuple = (("k", "a"),)) -> tuple[str, str, tuple]:
    return ("c", "c_total", labels)


def test_a_value_written_between_reads_is_seen(tmp_path: Path, make_reader) -> None:
    path = tmp_path / "counter_1.db"
    _write(path, {_counter(): 1.0})
    reader = make_reader(tmp_path)
    assert _view(reader) == {("c_total", (("k", "a"),)): 1.0}
    _write(path, {_counter(): 7.5})
    assert _view(reader) == {("c_total", (("k", "a"),)): 7.5}


def test_a_series_appended_to_a_file_appears(tmp_path: Path, make_reader) -> None:
    path = tmp_path / "counter_1.db"
    _write(path, {_counter(): 1.0})
    reader = make_reader(tmp_path)
    assert len(_view(reader)) == 1
    _write(path, {_counter((("k", "b"),)): 2.0})
    assert _view(reader) == {
        ("c_total", (("k", "a"),)): 1.0,
        ("c_total", (("k", "b"),)): 2.0,
    }


def test_a_file_grown_past_its_first_size_is_read_whole(tmp_path: Path, make_reader) -> None:
    path = tmp_path / "counter_1.db"
    _write(path, {_counter(): 1.0})
    reader = make_reader(tmp_path)
    _view(reader)
    size = path.stat().st_size
    # Enough keys to make prometheus_client double the file.
    many = {_counter((("k", f"series-{i:05d}-{'x' * 40}"),)): float(i) for i in range(1500)}
    _write(path, many)
    assert path.stat().st_size > size
    view = _view(reader)
    assert len(view) == 1501
    assert view[("c_total", (("k", f"series-01499-{'x' * 40}"),))] == 1499.0
    assert view == collector_view(tmp_path)


def test_a_replaced_file_is_read_again(tmp_path: Path, make_reader) -> None:
    path = tmp_path / "counter_1.db"
    _write(path, {_counter((("k", f"old-{i}"),)): 1.0 for i in range(200)})
    reader = make_reader(tmp_path)
    assert len(_view(reader)) == 200
    # Same name, new inode, smaller: a new process took the name (a wipe and a restart).
    new = tmp_path / "new.tmp"
    _write(new, {_counter((("k", "new"),)): 3.0})
    inode = path.stat().st_ino
    os.replace(new, path)
    assert path.stat().st_ino != inode
    assert _view(reader) == {("c_total", (("k", "new"),)): 3.0}


def test_a_file_replaced_by_one_of_the_same_size_is_read_again(tmp_path: Path, make_reader) -> None:
    path = tmp_path / "counter_1.db"
    _write(path, {_counter((("k", "aaaa"),)): 1.0})
    reader = make_reader(tmp_path)
    assert _view(reader) == {("c_total", (("k", "aaaa"),)): 1.0}
    new = tmp_path / "new.tmp"
    _write(new, {_counter((("k", "bbbb"),)): 2.0})
    assert new.read_bytes()[:4] == path.read_bytes()[:4], "same used size"
    os.replace(new, path)
    assert _view(reader) == {("c_total", (("k", "bbbb"),)): 2.0}


@pytest.mark.parametrize("grown", [False, True], ids=["same-size", "grown"])
def test_a_file_rewritten_in_place_holds_its_new_keys(
    tmp_path: Path, make_reader, grown: bool
) -> None:
    """Same inode, other keys at the cached offsets: no cached key may be reused unchecked."""
    directory, elsewhere = tmp_path / "d", tmp_path / "elsewhere"
    directory.mkdir()
    elsewhere.mkdir()
    path = directory / "counter_1.db"
    _write(path, {_counter((("k", "old"),)): 3.0})
    reader = make_reader(directory)
    for _ in range(2):  # the second read replays the first one's plan
        assert _view(reader) == {("c_total", (("k", "old"),)): 3.0}
    new = {_counter((("k", "new"),)): 3.0}
    if grown:
        new[_counter((("k", "more"),))] = 1.0
    _write(elsewhere / "counter_1.db", new)
    inode, size = path.stat().st_ino, path.stat().st_size
    with open(path, "r+b") as f:
        f.write((elsewhere / "counter_1.db").read_bytes())
    assert (path.stat().st_ino, path.stat().st_size) == (inode, size)
    expected = {("c_total", (("k", "new"),)): 3.0}
    if grown:
        expected[("c_total", (("k", "more"),))] = 1.0
    assert _view(reader) == expected == collector_view(directory)


def test_a_file_cut_short_in_place_is_read_again(tmp_path: Path, make_reader) -> None:
    path = tmp_path / "counter_1.db"
    _write(path, {_counter(): 4.0})
    reader = make_reader(tmp_path)
    _view(reader)
    used = int.from_bytes(path.read_bytes()[:4], "little")
    # Same inode, shorter: only the used part remains, then nothing.
    os.truncate(path, used)
    assert _view(reader) == {("c_total", (("k", "a"),)): 4.0}
    os.truncate(path, 0)
    result = reader.read()
    assert [c.split(":")[0] for c in result.corrupt_files] == ["counter_1.db"]


def test_a_removed_file_disappears(tmp_path: Path, make_reader) -> None:
    keep, gone = tmp_path / "counter_1.db", tmp_path / "counter_2.db"
    _write(keep, {_counter(): 1.0})
    _write(gone, {_counter(): 2.0, _counter((("k", "only-2"),)): 5.0})
    reader = make_reader(tmp_path)
    assert _view(reader) == {
        ("c_total", (("k", "a"),)): 3.0,
        ("c_total", (("k", "only-2"),)): 5.0,
    }
    gone.unlink()
    assert _view(reader) == {("c_total", (("k", "a"),)): 1.0}


@pytest.mark.parametrize("how", ["removed", "moved_away"])
def test_a_directory_replaced_under_its_path_is_followed(
    tmp_path: Path, make_reader, how: str
) -> None:
    """The entrypoint wipes the directory at start; a reader that watched the old one must
    see what is written into the new one, however many reads later."""
    directory = tmp_path / "prom"
    directory.mkdir()
    _write(directory / "counter_1.db", {_counter(): 1.0})
    reader = make_reader(directory)
    for _ in range(2):
        assert _view(reader) == {("c_total", (("k", "a"),)): 1.0}
    if how == "removed":
        (directory / "counter_1.db").unlink()
        directory.rmdir()
    else:
        directory.rename(tmp_path / "old")
    directory.mkdir()
    for _ in range(2):
        assert _view(reader) == {}
    _write(directory / "counter_2.db", {_counter(): 5.0})
    assert _view(reader) == {("c_total", (("k", "a"),)): 5.0}
    _write(directory / "counter_2.db", {_counter((("k", "b"),)): 2.0})  # a new key, in place
    assert _view(reader) == {("c_total", (("k", "a"),)): 5.0, ("c_total", (("k", "b"),)): 2.0}


def test_a_truncated_entry_at_the_end_is_skipped_and_counted(tmp_path: Path, make_reader) -> None:
    good, damaged = tmp_path / "counter_1.db", tmp_path / "counter_2.db"
    _write(good, {_counter(): 1.0})
    _write(damaged, {_counter(): 2.0})
    reader = make_reader(tmp_path)
    assert _view(reader) == {("c_total", (("k", "a"),)): 3.0}
    data = bytearray(damaged.read_bytes())
    used = int.from_bytes(data[:4], "little")
    # The used size now claims half an entry more: its key length and a few key bytes.
    data[used : used + 12] = (40).to_bytes(4, "little") + b'["c", "c_'
    data[:4] = (used + 12 + 4).to_bytes(4, "little")
    with open(damaged, "r+b") as f:  # in place: the same inode
        f.write(data)
    result = reader.read()
    assert [c.split(":")[0] for c in result.corrupt_files] == ["counter_2.db"]
    assert _view(reader) == {("c_total", (("k", "a"),)): 1.0}
    # Repaired in place (the writer finished its entry): read again in full.
    damaged.unlink()
    _write(damaged, {_counter(): 6.0})
    assert _view(reader) == {("c_total", (("k", "a"),)): 7.0}
    assert reader.read().corrupt_files == ()


_PIDS = st.sampled_from(["11", "12", "13"])
_LABELS = st.sampled_from(["a", "b", "c"])
_GAUGE_MODES = st.sampled_from(["all", "min", "max", "sum", "mostrecent", "liveall", "livesum"])
_AMOUNTS = st.integers(min_value=0, max_value=1000).map(lambda v: v / 4)
_STEP = st.one_of(
    st.tuples(st.just("counter"), _PIDS, _LABELS, _AMOUNTS),
    st.tuples(st.just("histogram"), _PIDS, _LABELS, _AMOUNTS),
    st.tuples(st.just("gauge"), _PIDS, _LABELS, _AMOUNTS, _GAUGE_MODES),
    st.tuples(st.just("remove"), _PIDS),
    st.tuples(st.just("replace"), _PIDS, _LABELS, _AMOUNTS),
)
"""One step of a history, applied by ``_apply``."""
_STEPS = st.lists(_STEP, min_size=1, max_size=12)
_BUCKETS = (1.0, 10.0, 100.0, float("inf"))


def _apply(directory: Path, step: tuple, clock: list[float]) -> None:
    kind, pid = step[0], step[1]
    if kind == "counter":
        _, _, label, amount = step
        path = directory / f"counter_{pid}.db"
        key = ("c", "c_total", (("k", label),))
        _write(path, {key: _current(path, key) + amount})
    elif kind == "histogram":
        _, _, label, amount = step
        path = directory / f"histogram_{pid}.db"
        labels = (("k", label),)
        updates = {("h", "h_sum", labels): _current(path, ("h", "h_sum", labels)) + amount}
        for bound in _BUCKETS:
            le = "+Inf" if bound == float("inf") else str(bound)
            key = ("h", "h_bucket", (*labels, ("le", le)))
            updates[key] = _current(path, key) + (1.0 if amount <= bound else 0.0)
        _write(path, updates)
    elif kind == "gauge":
        _, _, label, amount, mode = step
        clock[0] += 1.0
        path = directory / f"gauge_{mode}_{pid}.db"
        _write(path, {(f"g_{mode}", f"g_{mode}", (("k", label),)): amount}, stamp=clock[0])
    elif kind == "remove":
        for path in directory.glob(f"*_{pid}.db"):
            path.unlink()
    else:  # replace: a new file under the name, with a single series
        _, _, label, amount = step
        new = directory / "replacement.tmp"
        _write(new, {("c", "c_total", (("k", f"new-{label}"),)): amount})
        os.replace(new, directory / f"counter_{pid}.db")


def _current(path: Path, key: tuple[str, str, tuple]) -> float:
    if not path.exists():
        return 0.0
    metric, sample, labels = key
    wanted = mmap_key(metric, sample, [k for k, _ in labels], [v for _, v in labels], metric)
    db = MmapedDict(str(path), read_mode=True)
    try:
        for found, value, _ in db.read_all_values():
            if found == wanted:
                return value
    finally:
        db.close()
    return 0.0


@settings(
    max_examples=40,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=_STEPS)
def test_random_histories_merge_as_prometheus_client(tmp_path_factory, make_reader, steps) -> None:
    directory = tmp_path_factory.mktemp("history")
    reader = make_reader(directory)
    clock = [1_700_000_000.0]
    for number, step in enumerate(steps):
        _apply(directory, step, clock)
        expected = collector_view(directory)
        assert _view(reader) == pytest.approx(expected), f"after step {number}: {step}"
