"""The native merge (``runtime.metrics_proxy._metrics``) against the Python reference.

The reference is the proxy's former hot path, kept as the oracle: ``MultiprocReader`` (itself
tested against ``MultiProcessCollector``), ``parse_text_exposition``, ``merge_families`` and
``Encoder``. Random multiprocess histories must read the same families, series for series;
random families must encode to the same bytes; Triton texts must parse alike, or fail alike.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runtime.metrics_proxy import _metrics
from runtime.metrics_proxy.exposition import Encoder, Family, Sample
from runtime.metrics_proxy.merge import merge_families
from runtime.metrics_proxy.multiproc import MultiprocReader
from runtime.metrics_proxy.triton import TritonScrapeError, parse_text_exposition
from tests.metrics_proxy.test_metrics_proxy_cache import (
    _AMOUNTS,
    _GAUGE_MODES,
    _PIDS,
    _STEP,
    _STEPS,
    _apply,
    _write,
)
from tests.metrics_proxy.test_metrics_proxy_cache import _LABELS as _SERIES
from tests.metrics_proxy.test_metrics_proxy_exposition import TRICKY
from tests.support.metrics_harness import WriterProcesses
from tests.support.triton_metrics_server import render_exposition

POD = (("model_id", "llama-3-8b"), ("model_version", "v7"), ("colour", "green"))


def _native_view(families: list) -> dict:
    """{family: (type, help, {(sample, labels): value})} from ``FamilyList.families()``."""
    view = {}
    for name, typ, help_text, samples in families:
        series = {(s, labels): v for s, labels, v in samples}
        assert len(series) == len(samples), f"a series repeated in {name}"
        view[name] = (typ, help_text, series)
    return view


def _python_view(families: list[Family]) -> dict:
    return {
        f.name: (f.type, f.help, {(s.name, s.labels): s.value for s in f.samples}) for f in families
    }


def _same(native: dict, python: dict) -> None:
    assert native.keys() == python.keys()
    for name, (typ, help_text, series) in python.items():
        assert native[name][:2] == (typ, help_text), name
        assert native[name][2] == pytest.approx(series, nan_ok=True), name


@settings(
    max_examples=60,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=_STEPS)
def test_random_histories_read_as_the_python_reader(tmp_path_factory, steps) -> None:
    directory = tmp_path_factory.mktemp("history")
    python, native = MultiprocReader(directory), _metrics.MultiprocReader(str(directory))
    clock = [1_700_000_000.0]
    for number, step in enumerate(steps):
        _apply(directory, step, clock)
        expected = python.read()
        got = native.read()
        assert got.files == expected.files, f"after step {number}: {step}"
        _same(_native_view(got.families()), _python_view(expected.families))


_REREAD_STEP = st.one_of(
    _STEP,
    st.tuples(st.just("again")),
    # A mostrecent gauge created but never set (timestamp 0), or set back to that.
    st.tuples(st.just("declare"), _PIDS, _SERIES),
    # A gauge of one family written in files of every mode.
    st.tuples(st.just("shared"), _PIDS, _SERIES, _AMOUNTS, _GAUGE_MODES),
    # In place, the same inode: cut to its used size (still whole), cut into its entries, a
    # half-written entry, a used size that is no multiple of 8.
    st.tuples(
        st.just("damage"),
        _PIDS,
        st.integers(min_value=0, max_value=7),
        st.sampled_from(["tight", "cut", "half_entry", "odd"]),
    ),
)


def _reread_apply(directory: Path, step: tuple, clock: list[float], damaged: set[Path]) -> None:
    """``_apply`` plus the steps of ``_REREAD_STEP``; a damaged file that a writer writes
    again is a new file (the writer restarted)."""
    kind = step[0]
    if kind == "again":
        return
    if kind == "damage":
        _, pid, pick, how = step
        paths = sorted(directory.glob(f"*_{pid}.db"))
        if not paths:
            return
        path = paths[pick % len(paths)]
        data = bytearray(path.read_bytes())
        used = int.from_bytes(data[:4], "little")
        if how == "tight":
            os.truncate(path, used)
            return
        if how == "cut":
            os.truncate(path, max(used // 2, 4))
        elif how == "half_entry":
            data[used : used + 12] = (40).to_bytes(4, "little") + b'["c", "c_'
            data[:4] = (used + 16).to_bytes(4, "little")
            path.write_bytes(data)  # in place: "wb" truncates, keeping the inode
        else:
            data[:4] = (used + 4).to_bytes(4, "little")
            path.write_bytes(data)
        damaged.add(path)
        return
    if kind in ("declare", "shared"):
        pid, label = step[1], step[2]
        mode = "mostrecent" if kind == "declare" else step[4]
        path = directory / f"gauge_{mode}_{pid}.db"
    elif kind == "gauge":
        path = directory / f"gauge_{step[4]}_{step[1]}.db"
    else:
        path = directory / f"{'histogram' if kind == 'histogram' else 'counter'}_{step[1]}.db"
    if path in damaged:
        damaged.discard(path)
        path.unlink()
    if kind == "declare":
        _write(path, {("g_mostrecent", "g_mostrecent", (("k", label),)): 0.0}, stamp=0.0)
    elif kind == "shared":
        clock[0] += 1.0
        _write(path, {("g_shared", "g_shared", (("k", label),)): step[3]}, stamp=clock[0])
    else:
        _apply(directory, step, clock)
        damaged.intersection_update(directory.glob("*.db"))


def _corrupt_names(result) -> list[str]:
    return [c.split(":")[0] for c in result.corrupt_files]


@settings(
    max_examples=80,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(_REREAD_STEP, min_size=1, max_size=24))
# A mostrecent gauge first set in an earlier file moves ahead of another series.
@example(
    steps=[
        ("gauge", "12", "b", 1.0, "mostrecent"),
        ("gauge", "12", "a", 2.0, "mostrecent"),
        ("declare", "11", "a"),
        ("gauge", "11", "a", 3.0, "mostrecent"),
    ]
)
# One set back to never set disappears.
@example(steps=[("gauge", "11", "a", 1.0, "mostrecent"), ("declare", "11", "a")])
def test_one_reader_rereading_after_every_change_reads_as_a_new_one(
    tmp_path_factory, steps
) -> None:
    """The reader kept across reads replays its last merge while nothing changed and merges
    anew when anything did: it must read what the Python reader reads, and what a new
    native reader reads, family for family and sample for sample, in order."""
    directory = tmp_path_factory.mktemp("reread")
    python, native = MultiprocReader(directory), _metrics.MultiprocReader(str(directory))
    clock, damaged = [1_700_000_000.0], set()
    held = native.read()  # results a caller holds are never written by later reads
    held_text = repr(held.families())
    for number, step in enumerate(steps):
        _reread_apply(directory, step, clock, damaged)
        where = f"after step {number}: {step}"
        expected = python.read()
        for _ in range(2):  # the second read replays, if the first made a plan
            got = native.read()
            assert repr(held.families()) == held_text, where
            held, held_text = got, repr(got.families())
            fresh = _metrics.MultiprocReader(str(directory)).read()
            assert got.files == expected.files == fresh.files, where
            assert _corrupt_names(got) == _corrupt_names(expected) == _corrupt_names(fresh), where
            _same(_native_view(got.families()), _python_view(expected.families))
            assert repr(got.families()) == repr(fresh.families()), where


def _body(encoder: _metrics.Encoder, sources: list, own: list[Family], om: bool, gz: bool):
    writer = _metrics.BodyWriter(encoder, om, gz)
    own_list = _metrics.FamilyList.of(own)
    writer.reserve(own_list)
    for source in sources:
        writer.add(source)
    writer.add_reserved(own_list)
    body = writer.finish()
    return gzip.decompress(body) if gz else body


def _blocks(body: bytes) -> dict[str, tuple[list[str], set[str]]]:
    """Family name -> (its HELP and TYPE lines, its sample lines); # EOF is left out."""
    out: dict[str, tuple[list[str], set[str]]] = {}
    current = ""
    for line in body.decode().split("\n"):
        if line.startswith("# HELP "):
            current = line.split(" ")[2]
            out[current] = ([line], set())
        elif line.startswith("# TYPE "):
            out[current][0].append(line)
        elif line and line != "# EOF":
            out.setdefault(current, ([], set()))[1].add(line)
    return out


def test_the_whole_body_matches_the_python_path(tmp_path: Path) -> None:
    """Real writers' files and Triton's replay: every format, series for series."""
    with WriterProcesses(tmp_path, 3) as writers:
        writers.tick()
        writers.tick()
    own = [
        Family("up", "gauge", "up", [Sample("up", (("source", "vllm"),), 1.0)]),
        # A source family of the same name must lose to this one.
        Family("vllm:num_requests_running", "gauge", "shadowed", []),
    ]
    text = render_exposition(("llama-3-8b", "mistral-7b"), 3)
    python_families, _ = merge_families(
        [own, MultiprocReader(tmp_path).read().families, parse_text_exposition(text)]
    )
    encoder = _metrics.Encoder(list(POD))
    sources = [
        _metrics.MultiprocReader(str(tmp_path)).read(),
        _metrics.TextParser().parse(text.encode()),
    ]
    for om in (False, True):
        expected = Encoder(POD).encode(python_families, om)
        for gz in (False, True):
            body = _body(encoder, sources, own, om, gz)
            assert _blocks(body) == _blocks(expected)
            assert body.endswith(b"# EOF\n") == om
            assert len(body) == len(expected)


_NAMES = st.sampled_from(["a", "a_total", "b", "b_bucket", "c:x", "a_created", "d_count"])
_LABEL_VALUES = st.sampled_from(["x", 'q"uote', "back\\slash", "new\nline", "ü", ""])
_LABELS = st.lists(
    st.tuples(st.sampled_from(["k", "le", "colour", "model_id"]), _LABEL_VALUES),
    max_size=3,
    unique_by=lambda kv: kv[0],
).map(tuple)
_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**17), max_value=10**17).map(float),
    st.sampled_from([0.0, -0.0, 1e16, 1e15, 1e-5, 1e-4, 0.1, 123456789.0, 1e22, 5e-324]),
)
_FAMILIES = st.lists(
    st.builds(
        lambda name, typ, help_text, samples: Family(name, typ, help_text, samples),
        _NAMES,
        st.sampled_from(["counter", "gauge", "histogram", "untyped", "unknown", "summary"]),
        st.sampled_from(["", "plain", 'q"uote', "back\\slash", "new\nline"]),
        st.lists(st.builds(Sample, _NAMES, _LABELS, _VALUES), max_size=4),
    ),
    max_size=5,
)


# The proxy's own families, reserved ahead of every source: their names and sample names win.
_OWN = [
    Family("a", "gauge", "own", [Sample("a", (("source", "x"),), 1.0)]),
    Family("e", "counter", "own", [Sample("b_bucket", (), 2.0)]),
]


@settings(max_examples=300)
@given(sources=st.lists(_FAMILIES, max_size=3), om=st.booleans())
def test_random_families_encode_to_the_same_bytes(sources: list, om: bool) -> None:
    """Merge rules (names, sample owners), repeated series, escapes and number spelling."""
    merged, _ = merge_families([_OWN, *sources])
    assert merged[: len(_OWN)] == _OWN
    # The Python path writes the proxy's own families first, the native writer last.
    expected = Encoder(POD).encode(merged[len(_OWN) :] + _OWN, om)
    lists = [_metrics.FamilyList.of(s) for s in sources]
    assert _body(_metrics.Encoder(list(POD)), lists, _OWN, om, False) == expected


@pytest.mark.parametrize(
    "text",
    [
        TRICKY,
        render_exposition(("llama-3-8b", "mistral-7b"), 2),
        'a 1\r\nb{x="y"} 2 123\n  \t\n# TYPE a gauge\n',
        "# HELP c_total counted\n# TYPE c_total counter\nc_total 1\nc_created 5\n",
        '# TYPE h histogram\nh_bucket{le="1"} 1\nh_count 1\nh_sum 0.5\nother 2\n',
        '# TYPE odd  gauge  \nodd 1e3\nodd{a="1" , b = "2" } -inf\n',
        # Comments naming no valid metric declare nothing; `_total` alone keeps its name.
        "# TYPE foo-bar bogus\n# HELP  x y\n# TYPE  counter\n# TYPE _total counter\n_total 1\n",
        '# TYPE s summary\ns{quantile="0.5",_a="x",a_="y"} 1\ns_count 2\n:x:y 3\n',
    ],
)
def test_triton_texts_parse_as_the_python_parser(text: str) -> None:
    native = _native_view(_metrics.TextParser().parse(text.encode()).families())
    _same(native, _python_view(parse_text_exposition(text)))


@pytest.mark.parametrize(
    "text",
    [
        'nv_x{model="a"\n',
        "nv_x{model=a} 1\n",
        "nv_x\n",
        'nv_x{model="a"} one\n',
        'nv_x{m="a"}x} 1\n',
        'nv_x{m="a",} 1\n',
        "nv_x 0x10\n",
        # What Prometheus refuses a whole scrape over: names, types, label names.
        "foo.bar 1\n",
        "f\u00e9 1\n",
        'fo-o{a="1"} 1\n',
        '{a="1"} 1\n',
        "1abc 1\n",
        "# TYPE foo bogus\nfoo 1\n",
        "# TYPE foo counter extra\n",
        "# TYPE foo gauge\u00a0\n",
        'foo{a="1",a="2"} 1\n',
        'foo{__name__="x"} 1\n',
        'foo{a="1",__meta="2"} 1\n',
    ],
)
def test_malformed_texts_fail_in_both(text: str) -> None:
    with pytest.raises(TritonScrapeError):
        parse_text_exposition(text)
    with pytest.raises(ValueError, match="line 1"):
        _metrics.TextParser().parse(text.encode())


def test_invalid_utf8_and_a_missing_directory_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="UTF-8"):
        _metrics.TextParser().parse(b'a{b="\xff"} 1\n')
    with pytest.raises(OSError, match="No such file"):
        _metrics.MultiprocReader(str(tmp_path / "missing")).read()


def test_a_writer_is_spent_after_finish() -> None:
    writer = _metrics.BodyWriter(_metrics.Encoder([]), False, True)
    assert gzip.decompress(writer.finish()) == b""
    with pytest.raises(RuntimeError, match="twice"):
        writer.finish()


def test_values_are_spelled_as_python_repr() -> None:
    values = [0.0, -0.0, 1.0, -2.5, 1e15, 1e16, 1e-4, 1e-5, 0.1, 1 / 3, 2.0**60, 5e-324, 1e308]
    samples = [Sample("v", (("i", str(i)),), v) for i, v in enumerate(values)]
    families = [
        Family("v", "gauge", "", samples),
        Family("w", "gauge", "", [Sample("w", (("s", str(v)),), v) for v in (math.inf, -math.inf)]),
    ]
    body = _body(_metrics.Encoder([]), [_metrics.FamilyList.of(families)], [], False, False)
    assert body == Encoder(()).encode(families, False)


_CUT_UNDER_READS = """
import importlib.util, json, os, sys, threading, time
from pathlib import Path
from prometheus_client.mmap_dict import MmapedDict, mmap_key

spec = importlib.util.spec_from_file_location("_metrics", sys.argv[3])  # the caller's build
_metrics = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_metrics)
path = Path(sys.argv[1]) / "counter_1.db"
db = MmapedDict(str(path))
for i in range(20_000):
    db.write_value(mmap_key("c", "c_total", ["k"], [str(i)], "c"), 1.0, 0.0)
db.close()
whole = path.read_bytes()
reader = _metrics.MultiprocReader(str(path.parent))
stop = threading.Event()

def cut_and_restore():
    # In place, the same inode: cut to nothing, then written back whole.
    with open(path, "r+b") as f:
        while not stop.is_set():
            os.truncate(f.fileno(), 0)
            os.pwrite(f.fileno(), whole, 0)

cutter = threading.Thread(target=cut_and_restore)
cutter.start()
reads = corrupt = 0
deadline = time.monotonic() + float(sys.argv[2])
# At least 200 reads however slow the machine (a loaded CI machine under ASan did 68 in 2 s).
hard_stop = deadline + 60
while (time.monotonic() < deadline or reads < 200) and time.monotonic() < hard_stop:
    corrupt += bool(reader.read().corrupt_files)
    reads += 1
stop.set()
cutter.join()
total = sum(v for f in reader.read().families() for _, _, v in f[3])
print(json.dumps({"reads": reads, "corrupt": corrupt, "total": total}))
"""


def test_a_file_cut_under_its_mapping_is_read_again_not_fatal(tmp_path: Path) -> None:
    """A replay reads the kept files' mappings, and a file cut short under one raises SIGBUS
    on the reading thread: the reader must turn that into a full read (which reports the
    file while it is cut), never die of it. The cutter races the reader for two seconds and at
    least 200 reads, in a child that loads this process's build of the module (the sanitized
    one, in that run)."""
    run = subprocess.run(
        [sys.executable, "-c", _CUT_UNDER_READS, str(tmp_path), "2", _metrics.__file__],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, f"reader died (rc {run.returncode}): {run.stderr[-2000:]}"
    stats = json.loads(run.stdout)
    assert stats["reads"] > 100
    assert 0 < stats["corrupt"] < stats["reads"], "the race was not run"
    assert stats["total"] == 20_000.0
