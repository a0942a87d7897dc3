"""Parsing Triton's text format, merging and encoding both formats (prometheus_client's
encoders), and content negotiation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_prometheus

from runtime.metrics_proxy.exposition import (
    CONTENT_TYPE_OPENMETRICS,
    CONTENT_TYPE_TEXT,
    encode,
    negotiate,
    wants_gzip,
)
from runtime.metrics_proxy.merge import merge_families
from runtime.metrics_proxy.triton import (
    Family,
    Sample,
    TritonScrapeError,
    parse_text_exposition,
    to_metrics,
)

TRICKY = r"""# HELP nv_x Odd \\ help\nsecond line
# TYPE nv_x counter
nv_x{model="a \"quoted\" b",path="C:\\dir",note="brace } and, comma"} 3 1700000000000
nv_x{model="plain"} +Inf
# TYPE nv_g gauge
nv_g 0.5
untyped_thing{} NaN
"""


def _encode(
    families: list[Family], openmetrics: bool, labels: tuple[tuple[str, str], ...] = ()
) -> str:
    """Triton's parsed families as the proxy writes them: merged with the pod's labels."""
    merged, _ = merge_families([(to_metrics(families), False)], labels)
    return encode(merged, openmetrics).decode()


def test_parser_reads_escapes_timestamps_and_untyped() -> None:
    cache: dict = {}
    families = {f.name: f for f in parse_text_exposition(TRICKY, cache)}
    assert families["nv_x"].type == "counter"
    assert families["nv_x"].help == "Odd \\ help\nsecond line"
    first, second = families["nv_x"].samples
    assert first.labels == (
        ("model", 'a "quoted" b'),
        ("path", "C:\\dir"),
        ("note", "brace } and, comma"),
    )
    assert first.value == 3.0 and second.value == float("inf")
    assert families["nv_g"].samples == [Sample("nv_g", (), 0.5)]
    assert families["untyped_thing"].type == "untyped"
    # The cached parse of the same text gives the same result.
    again = {f.name: f for f in parse_text_exposition(TRICKY, cache)}
    assert again["nv_x"].samples == families["nv_x"].samples


@pytest.mark.parametrize(
    "line",
    ['nv_x{model="a"', "nv_x{model=a} 1", "nv_x", 'nv_x{model="a"} one', 'nv_x{m="a"}x} 1'],
)
def test_parser_rejects_malformed_lines(line: str) -> None:
    with pytest.raises(TritonScrapeError) as info:
        parse_text_exposition(line + "\n")
    assert info.value.reason == "parse" and "line 1" in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "foo.bar 1\n",
        "f\u00e9 1\n",
        "<html><body>oops</body></html>\n",
        "# TYPE foo bogus\nfoo 1\n",
        'foo{a="1",a="2"} 1\n',
        'foo{__name__="x"} 1\n',
    ],
)
def test_parser_rejects_what_prometheus_refuses_a_scrape_over(text: str) -> None:
    with pytest.raises(TritonScrapeError) as info:
        parse_text_exposition(text)
    assert info.value.reason == "parse" and "line 1" in str(info.value)


def test_comments_never_give_a_family_an_invalid_name() -> None:
    text = "# TYPE  counter\n# TYPE foo-bar gauge\n# TYPE _total counter\n_total 1\nok 2\n"
    families = parse_text_exposition(text)
    assert [f.name for f in families] == ["_total", "ok"]
    assert "# TYPE _total untyped\n_total 1.0\n" in _encode(families, False)
    body = _encode(families, True)
    assert [s.value for f in parse_openmetrics(body) for s in f.samples] == [1.0, 2.0]


def test_encoded_text_round_trips_through_prometheus_client_parser() -> None:
    families = parse_text_exposition(TRICKY)
    body = _encode(families, False, (("model_id", "m"), ("colour", "blue")))
    parsed = {f.name: f for f in parse_prometheus(body)}
    sample = parsed["nv_x"].samples[0]
    assert sample.labels == {
        "model": 'a "quoted" b',
        "path": "C:\\dir",
        "note": "brace } and, comma",
        "model_id": "m",
        "colour": "blue",
    }
    assert parsed["nv_x"].documentation == "Odd \\ help\nsecond line"


def test_openmetrics_counters_without_total_become_unknown() -> None:
    families = [
        Family("nv_c", "counter", "triton style", [Sample("nv_c", (("m", "a"),), 1.0)]),
        Family("vllm:t", "counter", "client style", [Sample("vllm:t_total", (), 2.0)]),
        Family("u", "untyped", "", [Sample("u", (), 3.0)]),
    ]
    body = _encode(families, True)
    parsed = {f.name: f for f in parse_openmetrics(body)}
    assert parsed["nv_c"].type == "unknown" and parsed["nv_c"].samples[0].name == "nv_c"
    assert parsed["vllm:t"].type == "counter"
    assert parsed["vllm:t"].samples[0].name == "vllm:t_total"
    assert parsed["u"].type == "unknown"
    text = _encode(families, False)
    # Text has no `unknown`: prometheus_client writes it as `untyped`, the same to Prometheus.
    assert "# TYPE nv_c untyped\n" in text and "# TYPE vllm:t_total counter\n" in text


def test_pod_labels_win_and_repeated_series_are_dropped() -> None:
    first = Family("f", "gauge", "", [Sample("f", (("colour", "x"), ("k", "1")), 1.0)])
    again = Family("g", "gauge", "", [Sample("g", (("k", "1"),), 2.0)] * 2)
    body = _encode([first, again], False, (("colour", "blue"),))
    lines = [line for line in body.splitlines() if not line.startswith("#")]
    assert lines == [
        'f{colour="blue",exported_colour="x",k="1"} 1.0',
        'g{colour="blue",k="1"} 2.0',
    ]


@pytest.mark.parametrize("unique", [True, False])
def test_series_told_apart_by_a_pod_label_stay_apart(unique: bool) -> None:
    """A plugin's counter labelled by its own model_id keeps each series, its label renamed
    ``exported_model_id`` as Prometheus renames a scraped label that clashes with a target's:
    replacing it would leave one series of the two and its value alone."""
    pod = (("model_id", "llama"), ("colour", "blue"))
    samples = [
        Sample("p_total", (("model_id", "a"),), 3.0),
        Sample("p_total", (("model_id", "b"), ("exported_model_id", "c")), 4.0),
        Sample("p_total", (("model_id", ""),), 5.0),
    ]
    merged, _ = merge_families([(to_metrics([Family("p", "counter", "", samples)]), unique)], pod)
    assert [(s.labels, s.value) for f in merged for s in f.samples] == [
        ({"model_id": "llama", "colour": "blue", "exported_model_id": "a"}, 3.0),
        (
            {
                "model_id": "llama",
                "colour": "blue",
                "exported_model_id": "c",
                "exported_exported_model_id": "b",
            },
            4.0,
        ),
        # An empty label is no label, to Prometheus as here.
        ({"model_id": "llama", "colour": "blue"}, 5.0),
    ]


def test_merge_prefers_earlier_sources_and_owns_sample_names() -> None:
    vllm = [Family("vllm:p", "counter", "v", [Sample("vllm:p_total", (("engine", "0"),), 5.0)])]
    triton = [
        Family("vllm:p", "counter", "t", [Sample("vllm:p_total", (("model", "a"),), 4.0)]),
        Family("vllm:p_total", "untyped", "t", [Sample("vllm:p_total", (), 1.0)]),
        Family("nv_y", "gauge", "t", [Sample("nv_y", (), 1.0)]),
    ]
    merged, dropped = merge_families([(to_metrics(vllm), True), (to_metrics(triton), False)], ())
    assert dropped == [0, 1]
    assert [(f.name, [s.value for s in f.samples]) for f in merged] == [
        ("vllm:p", [5.0]),
        ("nv_y", [1.0]),
    ]


@pytest.mark.parametrize(
    ("accept", "openmetrics"),
    [
        (None, False),
        ("*/*", False),
        ("text/plain;version=0.0.4", False),
        ("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5", True),
        ("application/openmetrics-text;q=0.2,text/plain;q=0.9", False),
        ("application/openmetrics-text;q=0", False),
        # q is a number of up to three decimals, its name case-insensitive (RFC 9110).
        ("application/openmetrics-text;Q=0.1,text/plain;q=0.5", False),
        ("application/openmetrics-text;Q=0.9,text/plain;q=0.5", True),
        ("application/openmetrics-text;q=0.000", False),
        ("application/openmetrics-text;q=2,text/plain;q=0.5", False),
        ("application/openmetrics-text;q=0.0001", False),
    ],
)
def test_negotiation(accept: str | None, openmetrics: bool) -> None:
    assert negotiate(accept) == (
        (True, CONTENT_TYPE_OPENMETRICS) if openmetrics else (False, CONTENT_TYPE_TEXT)
    )


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, False),
        ("gzip", True),
        ("br, gzip;q=0.5", True),
        ("gzip;q=0", False),
        ("br", False),
        ("gzip;q=0.00", False),
        ("gzip;q=0.000", False),
        ("gzip;Q=0", False),
        ("gzip; Q = 0.001", True),
        ("gzip;q=1.000", True),
        ("gzip;q=bad", False),
    ],
)
def test_gzip_acceptance(header: str | None, expected: bool) -> None:
    assert wants_gzip(header) is expected


_label_values = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12
)
_values = st.floats(allow_nan=False) | st.sampled_from([float("inf"), float("-inf")])


@settings(max_examples=150)
@given(
    series=st.dictionaries(
        st.tuples(_label_values, _label_values), _values, min_size=1, max_size=6
    ),
    help_text=st.text(max_size=20),
)
def test_text_encoding_round_trips_through_the_triton_parser(series, help_text) -> None:
    samples = [Sample("nv_x", (("a", a), ("b", b)), v) for (a, b), v in series.items()]
    family = Family("nv_x", "gauge", help_text, samples)
    body = _encode([family], False)
    (parsed,) = parse_text_exposition(body)
    assert parsed.samples == samples
    assert parsed.help == help_text


@settings(max_examples=100)
@given(
    series=st.dictionaries(
        _label_values, st.floats(min_value=0) | st.just(float("inf")), min_size=1, max_size=6
    ),
    help_text=st.text(max_size=20),
)
def test_openmetrics_encoding_parses_back_with_prometheus_client(series, help_text) -> None:
    samples = [Sample("vllm:x_total", (("a", a),), v) for a, v in series.items()]
    body = _encode([Family("vllm:x", "counter", help_text, samples)], True, (("colour", "blue"),))
    (parsed,) = parse_openmetrics(body)
    # Parsers skip the blanks between the name and the help text (Prometheus does too), so
    # leading spaces of a help text never survive any exposition format.
    assert parsed.documentation == help_text.lstrip(" ")
    got = {s.labels["a"]: s.value for s in parsed.samples}
    assert got == series
