"""The proxy's multiprocess reader against prometheus_client's own collector, and file faults
(each also run against the collector behind the proxy's reader interface)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_prometheus

from runtime.metrics_proxy.exposition import encode
from runtime.metrics_proxy.multiproc import MultiprocReader, ReaderFactory
from tests.metrics_proxy.collector_reader import CollectorReader, collector_view

GAUGE_MODES = (
    "all",
    "liveall",
    "min",
    "livemin",
    "max",
    "livemax",
    "sum",
    "livesum",
    "mostrecent",
    "livemostrecent",
)
# A process writing every metric type and every gauge mode, then waiting to be told to exit.
WRITER = textwrap.dedent(
    """
    import sys, time
    from prometheus_client import Counter, Gauge, Histogram, Summary
    index = int(sys.argv[1])
    Counter("c", "c", ["k"]).labels("a").inc(index + 1)
    h = Histogram("h", "h", ["k"], buckets=(0.1, 1, 10))
    h.labels("a").observe(0.5 * (index + 1))
    Summary("s", "s").observe(index + 2)
    for mode in {modes!r}:
        Gauge("g_" + mode, mode, ["k"], multiprocess_mode=mode).labels("a").set(10 * index + 1)
        time.sleep(0.002)  # distinct timestamps for the mostrecent modes
    print("ready", flush=True)
    sys.stdin.readline()
    """
).format(modes=GAUGE_MODES)


def _spawn(directory: Path, index: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(index)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture(params=["collector", "python_reader"])
def reader(request: pytest.FixtureRequest) -> ReaderFactory:
    return CollectorReader if request.param == "collector" else MultiprocReader


def _reader_view(
    reader: ReaderFactory, directory: Path, mark_dead: bool = False
) -> dict[tuple[str, tuple], float]:
    result = reader(directory, mark_dead).read()
    view = {}
    for family in result.families:
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in view, f"duplicate {key}"
            view[key] = s.value
    return view


@pytest.fixture(scope="module")
def mode_dir(tmp_path_factory: pytest.TempPathFactory):
    """Three exited processes' files plus one still running, every gauge mode."""
    directory = tmp_path_factory.mktemp("modes")
    procs = [_spawn(directory, i) for i in range(4)]
    for proc in procs[:3]:
        proc.communicate("exit\n", timeout=10)
    yield directory, procs[3]
    procs[3].communicate("exit\n", timeout=10)


def test_merge_equals_prometheus_client(mode_dir, reader) -> None:
    directory, _ = mode_dir
    expected = collector_view(directory)
    assert ("g_all", (("k", "a"), ("pid", str(os.getpid())))) not in expected
    assert len(expected) > 20
    assert _reader_view(reader, directory) == expected


def test_dead_processes_per_gauge_mode(mode_dir, reader, tmp_path: Path) -> None:
    directory, alive = mode_dir
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    # Without mark_process_dead, a dead process still counts in every mode, as upstream.
    assert _reader_view(reader, copy) == collector_view(copy)
    # With it (opt-in: the pod shares its process namespace), live* gauges drop dead pids,
    # exactly as prometheus_client's mark_process_dead does; other modes keep them.
    reference = tmp_path / "reference"
    shutil.copytree(directory, reference)
    pids = {p.name.rsplit("_", 1)[1][:-3] for p in reference.glob("gauge_live*.db")}
    for pid in pids - {str(alive.pid)}:
        mark_process_dead(int(pid), str(reference))
    view = _reader_view(reader, copy, mark_dead=True)
    assert view == collector_view(reference)
    assert view[("g_livesum", (("k", "a"),))] == 31.0  # only the live process (index 3)
    assert view[("g_sum", (("k", "a"),))] == 1 + 11 + 21 + 31.0
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in reference.iterdir())


def _valid_file(directory: Path) -> Path:
    return next(directory.glob("counter_*.db"))


@pytest.mark.parametrize(
    "damage",
    ["short_header", "used_past_end", "truncated_mid_entry", "bad_key", "bad_length"],
)
def test_corrupt_file_is_skipped_and_named(mode_dir, reader, tmp_path: Path, damage: str) -> None:
    directory, _ = mode_dir
    good = tmp_path / "good"
    shutil.copytree(directory, good)
    expected = _reader_view(reader, good)
    data = _valid_file(good).read_bytes()
    used = int.from_bytes(data[:4], "little")
    bad = {
        "short_header": data[:5],
        "used_past_end": data[:used][: used - 8],
        "truncated_mid_entry": (used - 4).to_bytes(4, "little") + data[4 : used - 4],
        "bad_key": data[:12] + b"\xff\xfe{not json" + data[23:],
        "bad_length": data[:8] + (1 << 30).to_bytes(4, "little") + data[12:],
    }[damage]
    (good / "counter_999999.db").write_bytes(bad)
    result = reader(good, False).read()
    assert [c.split(":")[0] for c in result.corrupt_files] == ["counter_999999.db"]
    assert _reader_view(reader, good) == expected


@pytest.mark.parametrize("state", ["empty", "zero_header"])
def test_a_file_being_created_is_no_corrupt_one(mode_dir, tmp_path: Path, state: str) -> None:
    """``MmapedDict`` creates its file empty, sizes it, then writes the header: a read in
    between finds no series yet, as the collector does for the zero header, and no damage."""
    directory, _ = mode_dir
    good = tmp_path / "good"
    shutil.copytree(directory, good)
    expected = _reader_view(MultiprocReader, good)
    (good / "counter_999999.db").write_bytes(b"" if state == "empty" else bytes(1 << 16))
    result = MultiprocReader(good, False).read()
    assert result.corrupt_files == ()
    assert result.files == len(list(good.iterdir()))
    assert _reader_view(MultiprocReader, good) == expected


def test_process_killed_while_writing(reader, tmp_path: Path) -> None:
    """A writer SIGKILLed mid-loop leaves a readable file; its counts stay, as upstream."""
    script = textwrap.dedent(
        """
        from prometheus_client import Counter
        c = Counter("spin", "spin", ["k"])
        i = 0
        while True:
            c.labels(str(i % 500)).inc()
            i += 1
            if i == 2000:
                print("going", flush=True)
        """
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"going"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    result = reader(tmp_path, False).read()
    assert result.corrupt_files == ()
    assert _reader_view(reader, tmp_path) == collector_view(tmp_path)
    total = sum(s.value for f in result.families for s in f.samples)
    assert total >= 2000


def _stale_files(directory: Path, source: Path, count: int) -> None:
    data = source.read_bytes()
    for pid in range(100_000, 100_000 + count):
        (directory / f"counter_{pid}.db").write_bytes(data)


def test_thousands_of_stale_files_are_all_counted(mode_dir, reader, tmp_path: Path) -> None:
    """Files of processes long gone stay counted, as upstream; memory grows with what they hold
    (the collector merges all samples at once), bounded here for 3,000 small files."""
    directory, _ = mode_dir
    source = _valid_file(directory)
    few, many = tmp_path / "few", tmp_path / "many"
    few.mkdir()
    many.mkdir()
    _stale_files(few, source, 200)
    _stale_files(many, source, 3000)

    def peak(path: Path) -> tuple[int, float]:
        files = reader(path, False)
        tracemalloc.start()
        result = files.read()
        _, peak_bytes = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        value = next(s.value for f in result.families if f.name == "c" for s in f.samples)
        assert result.files == len(list(path.iterdir())) and result.corrupt_files == ()
        return peak_bytes, value

    few_peak, few_value = peak(few)
    many_peak, many_value = peak(many)
    assert many_value == pytest.approx(few_value * 3000 / 200)
    assert many_peak < 16 << 20, (few_peak, many_peak)


def test_one_series_under_two_keys_of_one_file_adds_up(reader, tmp_path: Path) -> None:
    """A process that made one metric twice with two help texts holds one series under two keys:
    both count, as in prometheus_client's collector."""
    values = MmapedDict(str(tmp_path / "counter_1.db"))
    values.write_value(mmap_key("c", "c_total", ["k"], ["a"], "first help"), 5.0, 0.0)
    values.write_value(mmap_key("c", "c_total", ["k"], ["a"], "second help"), 7.0, 0.0)
    values.close()
    view = _reader_view(reader, tmp_path)
    assert view == collector_view(tmp_path)
    assert view[("c_total", (("k", "a"),))] == 12.0


def test_marking_dead_processes_in_a_read_only_directory_keeps_the_series(
    mode_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Removing a dead process's files fails on a read-only mount (as root, this machine's only
    way to get one is to make ``os.remove`` answer as such a mount does): the merge goes on as
    with marking off, and marking stops after one warning."""
    directory, _ = mode_dir
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)

    def read_only(path: str) -> None:
        raise OSError(errno.EROFS, "Read-only file system", path)

    monkeypatch.setattr(os, "remove", read_only)
    files = MultiprocReader(copy, mark_dead_processes=True)
    with caplog.at_level(logging.WARNING, logger="runtime.metrics_proxy.multiproc"):
        first, second = files.read(), files.read()
    unmarked = _reader_view(MultiprocReader, copy)
    for result in (first, second):
        assert result.corrupt_files == ()
        view = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in result.families
            for s in family.samples
        }
        assert view == unmarked
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Read-only file system" in warnings[0], warnings


def test_a_lone_surrogate_in_a_label_or_help_never_fails_the_body(tmp_path: Path) -> None:
    """json.loads gives a key's unpaired ``\\udXXX`` escape (a path decoded with
    surrogateescape, a client's LoRA name) as a lone surrogate, which no UTF-8 body holds:
    it is written U+FFFD, and the rest of the series as they are."""
    values = MmapedDict(str(tmp_path / "counter_1.db"))
    path = os.fsdecode(b"/models/caf\xe9")
    values.write_value(mmap_key("c", "c_total", ["m"], [path], "help \udce9"), 5.0, 0.0)
    values.write_value(mmap_key("c", "c_total", ["m"], ["ok"], "help \udce9"), 7.0, 0.0)
    values.close()
    families = MultiprocReader(tmp_path).read().families
    for openmetrics, parse in ((False, parse_prometheus), (True, parse_openmetrics)):
        (family,) = parse(encode(families, openmetrics).decode())
        assert family.documentation == "help \ufffd"
        assert {s.labels["m"]: s.value for s in family.samples} == {
            "/models/caf\ufffd": 5.0,
            "ok": 7.0,
        }
