"""Triton's metrics: fetched with httpx, parsed strictly, returned as prometheus_client families.

The parser refuses what Prometheus would refuse a whole scrape over (names, types, labels,
separators, values, timestamps): such a body fails Triton's source alone, never the scrape.
prometheus_client's own text parser accepts most of those lines, so it cannot stand in here.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import NamedTuple

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample as PromSample

__all__ = [
    "Family",
    "LabelSet",
    "Sample",
    "SeriesCache",
    "TritonClient",
    "TritonScrapeError",
    "parse_text_exposition",
    "to_metrics",
]

LabelSet = tuple[tuple[str, str], ...]
"""Label pairs in the order Triton wrote them."""


class Sample(NamedTuple):
    """One parsed series value; ``name`` is the full sample name (``x_bucket``, ``x_total``)."""

    # A NamedTuple, not a frozen dataclass: a scrape builds about a thousand of these.
    name: str
    labels: LabelSet
    value: float


@dataclass(slots=True)
class Family:
    """A parsed metric family: ``name`` is the base name (a counter's without ``_total``)."""

    name: str
    type: str
    help: str
    samples: list[Sample] = field(default_factory=list)


_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")
# Only spaces and tabs separate tokens, as in Prometheus's own parsers: any other character,
# Unicode whitespace too, belongs to a token (and no name, value or timestamp holds one).
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,|\})')
_BLANKS = re.compile(r"[ \t]+")
# "#", keyword and metric name, each after a run of blanks; the rest follows one blank.
_COMMENT = re.compile(r"#[ \t]+(HELP|TYPE)[ \t]+([^ \t]*)(?:[ \t](.*))?")
# What Prometheus takes (Go's ParseFloat, less its hex form); float() would also take
# underscores, non-ASCII digits and whitespace around them.
_VALUE = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(?i:inf|infinity|nan))"
)
_TIMESTAMP = re.compile(r"([+-]?)([0-9]+)")
_UNESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}
# Prometheus refuses a whole scrape over one name outside these, or over another type word.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_TYPES = frozenset(("counter", "gauge", "histogram", "summary", "untyped"))


class TritonScrapeError(Exception):
    """Triton's metrics could not be read; ``reason`` is the error counter's label value."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _UNESCAPE.sub(lambda m: _UNESCAPED.get(m.group(1), "\\" + m.group(1)), value)


SeriesCache = dict[str, tuple[str, LabelSet]]
"""Parsed ``name{labels}`` text by its raw form: the same on every scrape of one Triton."""
_SERIES_CACHE_LIMIT = 50_000


def _check_name(name: str, line: str, lineno: int) -> None:
    if not _METRIC_NAME.fullmatch(name):
        raise TritonScrapeError("parse", f"line {lineno}: bad metric name in {line!r}")


def _parse_series(line: str, lineno: int) -> tuple[str, LabelSet, int]:
    brace = line.find("{")
    name = line[:brace]
    _check_name(name, line, lineno)
    labels: list[tuple[str, str]] = []
    pos = brace + 1
    if line[pos : pos + 1] == "}":
        return name, (), pos + 1
    while True:
        match = _LABEL.match(line, pos)
        if match is None:
            raise TritonScrapeError("parse", f"line {lineno}: bad labels in {line!r}")
        label = match.group(1)
        # Names starting with __ are Prometheus's own; a repeated one fails the whole scrape.
        if label.startswith("__"):
            raise TritonScrapeError("parse", f"line {lineno}: reserved label name in {line!r}")
        if any(label == k for k, _ in labels):
            raise TritonScrapeError("parse", f"line {lineno}: repeated label name in {line!r}")
        labels.append((label, _unescape(match.group(2))))
        pos = match.end()
        if match.group(3) == "}":
            return name, tuple(labels), pos


def _parse_sample(line: str, lineno: int, cache: SeriesCache) -> Sample:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        # The value and timestamp never hold a brace, so the last one closes the labels.
        end = line.rfind("}") + 1
        series = line[:end]
        parsed = cache.get(series)
        if parsed is None:
            name, labels, stop = _parse_series(line, lineno)
            if stop != end:
                raise TritonScrapeError("parse", f"line {lineno}: bad labels in {line!r}")
            if len(cache) >= _SERIES_CACHE_LIMIT:
                cache.clear()
            parsed = cache[series] = (name, labels)
        name, labels = parsed
        rest = line[end:]
    else:
        name, *tail = _BLANKS.split(line, maxsplit=1)
        rest = tail[0] if tail else ""
        labels = ()
        _check_name(name, line, lineno)
    return Sample(name, labels, _parse_value(rest, line, lineno))


def _parse_value(rest: str, line: str, lineno: int) -> float:
    """The value of ``rest``, the text after a sample's series: value, then a timestamp or not."""
    # A "\r" ends the line only where the "\n" follows it (CRLF).
    tokens = _BLANKS.split(rest.lstrip(" \t").rstrip(" \t\r"))
    if not tokens[0]:
        raise TritonScrapeError("parse", f"line {lineno}: no value in {line!r}")
    if not _VALUE.fullmatch(tokens[0]):
        raise TritonScrapeError("parse", f"line {lineno}: bad value in {line!r}")
    if len(tokens) > 1 and not _valid_timestamp(tokens[1]):
        raise TritonScrapeError("parse", f"line {lineno}: bad timestamp in {line!r}")
    if len(tokens) > 2:
        raise TritonScrapeError("parse", f"line {lineno}: text after the timestamp in {line!r}")
    return float(tokens[0])


def _valid_timestamp(token: str) -> bool:
    """An integer in int64's range: Go's strconv.ParseInt, as prometheus/common's TextParser
    reads a timestamp."""
    match = _TIMESTAMP.fullmatch(token)
    if match is None:
        return False
    # Bounded first: int() refuses a string of over 4,300 digits.
    digits = match[2].lstrip("0") or "0"
    return len(digits) <= 19 and -(2**63) <= int(match[1] + digits) < 2**63


def _base_name(declared: str, typ: str) -> str:
    # `_total` alone keeps its name: an empty family name is no valid exposition.
    if typ == "counter" and declared.endswith("_total") and declared != "_total":
        return declared[: -len("_total")]
    return declared


def parse_text_exposition(text: str, cache: SeriesCache | None = None) -> list[Family]:
    """Parse Prometheus text format 0.0.4; raises ``TritonScrapeError`` on a malformed line,
    including any that Prometheus would refuse the whole scrape over (names, types, labels).

    Pass the same ``cache`` on every scrape of one endpoint to skip re-parsing its labels.
    """
    cache = {} if cache is None else cache
    families: dict[str, Family] = {}
    declared: dict[str, tuple[str, str]] = {}  # declared name -> (type, help)
    current: Family | None = None
    # Only "\n" ends a line: label values and help may hold "\r" or U+2028 raw, which
    # str.splitlines() would split on.
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.lstrip(" \t")
        if not line.strip(" \t\r"):
            continue
        if line.startswith("#"):
            comment = _COMMENT.fullmatch(line)
            # A comment naming no valid metric declares nothing: no sample can take its name.
            if comment is not None and _METRIC_NAME.fullmatch(comment[2]):
                keyword, name, rest = comment[1], comment[2], comment[3] or ""
                typ, help_text = declared.get(name, ("untyped", ""))
                if keyword == "HELP":
                    help_text = _unescape(rest)
                else:
                    typ = rest.lstrip(" \t").rstrip(" \t\r") or "untyped"
                    if typ not in _TYPES:
                        raise TritonScrapeError("parse", f"line {lineno}: unknown type in {line!r}")
                declared[name] = (typ, help_text)
            continue
        sample = _parse_sample(line, lineno, cache)
        if current is None or not (
            sample.name == current.name
            or (
                sample.name.startswith(current.name)
                and sample.name[len(current.name) :] in _SUFFIXES
            )
        ):
            current = _family_for(sample.name, declared, families)
        current.samples.append(sample)
    return list(families.values())


def _family_for(
    sample_name: str, declared: dict[str, tuple[str, str]], families: dict[str, Family]
) -> Family:
    candidates = [sample_name] + [
        sample_name[: -len(s)] for s in _SUFFIXES if sample_name.endswith(s)
    ]
    for name in candidates:
        if name in declared:
            typ, help_text = declared[name]
            base = _base_name(name, typ)
            break
    else:
        typ, help_text, base = "untyped", "", sample_name
    family = families.get(base)
    if family is None:
        family = families[base] = Family(base, typ, help_text)
    return family


def to_metrics(families: list[Family]) -> list[Metric]:
    """prometheus_client families for parsed ones, keeping every sample name as Triton wrote it.

    Triton's counters lack ``_total``; prometheus_client's encoders would declare them under a
    ``_total`` name no sample has, so they (and ``untyped`` ones) become ``unknown`` families
    named after their samples, which both formats accept and Prometheus reads the same way.
    """
    out: list[Metric] = []
    for fam in families:
        typ, name = fam.type, fam.name
        if typ == "untyped" or (typ == "counter" and not _counter_has_total(fam)):
            typ = "unknown"
            name = fam.samples[0].name if fam.samples else fam.name
        metric = Metric(name, fam.help, typ)
        metric.samples = [PromSample(s.name, dict(s.labels), s.value) for s in fam.samples]
        out.append(metric)
    return out


def _counter_has_total(family: Family) -> bool:
    total = family.name + "_total"
    return all(s.name in (total, family.name + "_created") for s in family.samples)


class TritonClient:
    """Fetches Triton's ``/metrics`` over one kept-alive connection, bounded in time and size.

    ``trust_env=False``: the pod's ``HTTP_PROXY``/``NO_PROXY`` must never route a loopback
    fetch through a proxy, nor may ``SSL_*``/``.netrc`` settings change it.
    """

    def __init__(self, url: str, timeout_s: float, max_bytes: int) -> None:
        self.url = url
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._client = httpx.AsyncClient(
            trust_env=False,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            headers={"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity"},
        )

    async def fetch(self) -> str:
        """Triton's body as text; raises ``TritonScrapeError`` with the reason of the failure."""
        try:
            # httpx bounds each read; this bounds the whole request, a trickling body too.
            async with asyncio.timeout(self._timeout_s):
                return await self._fetch()
        except TimeoutError as exc:
            raise TritonScrapeError(
                "timeout", f"{self.url}: did not answer within {self._timeout_s:g} s"
            ) from exc
        except httpx.TimeoutException as exc:
            raise TritonScrapeError(
                "timeout", f"{self.url}: did not answer within {self._timeout_s:g} s"
            ) from exc
        except httpx.HTTPError as exc:
            raise TritonScrapeError("connect", f"{self.url}: {exc!r}") from exc

    async def _fetch(self) -> str:
        async with self._client.stream("GET", self.url) as response:
            if response.status_code != 200:
                raise TritonScrapeError(
                    "http_status", f"{self.url}: answered {response.status_code}"
                )
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self._max_bytes:
                    raise TritonScrapeError(
                        "too_large", f"{self.url}: sent over {self._max_bytes} bytes"
                    )
                chunks.append(chunk)
        try:
            return b"".join(chunks).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TritonScrapeError("parse", f"{self.url}: body is not UTF-8: {exc}") from exc

    async def aclose(self) -> None:
        """Close the kept-alive connection."""
        await self._client.aclose()
