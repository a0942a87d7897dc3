"""Metric families as the proxy holds them, and their Prometheus text and OpenMetrics encodings.

The proxy writes its bodies with the native ``_metrics.BodyWriter``; ``Encoder`` (with
``merge.merge_families``) is the reference that it is tested against byte for byte.

The proxy writes both formats itself: ``prometheus_client``'s encoders rename counters that
lack ``_total`` (all of Triton's) and escape ``:`` in OpenMetrics, which would change the
series names that the dashboards and alerts query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

from prometheus_client.utils import floatToGoString

__all__ = [
    "CONTENT_TYPE_OPENMETRICS",
    "CONTENT_TYPE_TEXT",
    "Encoder",
    "Family",
    "LabelSet",
    "Sample",
    "negotiate",
    "wants_gzip",
]

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"

LabelSet = tuple[tuple[str, str], ...]
"""Label pairs in the order they are written."""


class Sample(NamedTuple):
    """One series value; ``name`` is the full sample name (``x_bucket``, ``x_total``, ...)."""

    # A NamedTuple, not a frozen dataclass: a scrape builds about a thousand of these, and
    # a frozen dataclass's __init__ costs several times more.
    name: str
    labels: LabelSet
    value: float


@dataclass(slots=True)
class Family:
    """A metric family: ``name`` is the base name (a counter's without ``_total``)."""

    name: str
    type: str
    help: str
    samples: list[Sample] = field(default_factory=list)


def _format_value(value: float) -> str:
    """``repr`` for ordinary floats (both formats parse it); Go's spelling of inf and NaN."""
    text = repr(value)
    return text if text[-1].isdigit() else floatToGoString(value)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _counter_has_total(family: Family) -> bool:
    total = family.name + "_total"
    return all(s.name in (total, family.name + "_created") for s in family.samples)


class Encoder:
    """Writes families with the pod's constant labels, each series at most once.

    The text before each value (name and labels) is cached per series: it is the same on
    every scrape, and building it is most of the cost of an exposition.
    """

    def __init__(self, constant_labels: LabelSet, cache_limit: int = 100_000) -> None:
        self._constant = constant_labels
        self._constant_names = frozenset(k for k, _ in constant_labels)
        self._limit = cache_limit
        self._prefixes: dict[tuple[str, LabelSet], str] = {}

    def _prefix(self, sample: Sample) -> str:
        key = (sample.name, sample.labels)
        prefix = self._prefixes.get(key)
        if prefix is None:
            # The pod's identity wins over a source's label of the same name.
            labels = [kv for kv in sample.labels if kv[0] not in self._constant_names]
            labels.extend(self._constant)
            text = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
            prefix = f"{sample.name}{{{text}}} " if text else f"{sample.name} "
            if len(self._prefixes) >= self._limit:
                self._prefixes.clear()
            self._prefixes[key] = prefix
        return prefix

    def encode(self, families: list[Family], openmetrics: bool) -> bytes:
        """Encode as OpenMetrics 1.0 or Prometheus text 0.0.4; a repeated series is dropped."""
        out: list[str] = []
        seen: set[str] = set()
        for fam in families:
            name, typ = fam.name, fam.type
            has_total = typ == "counter" and _counter_has_total(fam)
            if openmetrics:
                if typ == "untyped":
                    typ = "unknown"
                elif typ == "counter" and not has_total:
                    # OpenMetrics counters must end in _total; Triton's do not. Declaring them
                    # `unknown` keeps the series names the queries use and the output valid.
                    typ = "unknown"
                    name = fam.samples[0].name if fam.samples else fam.name
                help_text = fam.help.replace("\\", "\\\\").replace("\n", "\\n")
                help_text = help_text.replace('"', '\\"')
            else:
                if has_total:
                    name += "_total"
                elif typ == "unknown":
                    typ = "untyped"
                help_text = fam.help.replace("\\", "\\\\").replace("\n", "\\n")
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} {typ}\n")
            for s in fam.samples:
                if not openmetrics and s.name.endswith("_created"):
                    continue
                prefix = self._prefix(s)
                if prefix in seen:
                    continue
                seen.add(prefix)
                out.append(f"{prefix}{_format_value(s.value)}\n")
        if openmetrics:
            out.append("# EOF\n")
        return "".join(out).encode("utf-8")


# An RFC 9110 qvalue: "0" or "1", then at most three decimals, at most 1.
_QVALUE = re.compile(r"0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?")
# What the native server trims around header items (TrimBlanks): space, tab, CR.
_BLANKS = " \t\r"


def _quality(params: list[str]) -> float:
    """The q of one header item's parameters (names case-insensitive); 1 if none.

    Any weight that is no qvalue counts as 0: what a client gets by default (identity, text)
    is always acceptable, a response it may refuse is not.
    """
    q = 1.0
    for param in params:
        key, _, value = param.partition("=")
        if key.strip(_BLANKS).lower() == "q":
            value = value.strip(_BLANKS)
            q = float(value) if _QVALUE.fullmatch(value) else 0.0
    return q


def _accept_quality(accept: str) -> tuple[float, float]:
    """Highest q for OpenMetrics and for plain text in an Accept header."""
    om = text = 0.0
    for item in accept.split(","):
        parts = [p.strip(_BLANKS) for p in item.split(";")]
        media, q = parts[0].lower(), _quality(parts[1:])
        if media == "application/openmetrics-text":
            om = max(om, q)
        elif media in ("text/plain", "text/*", "*/*"):
            text = max(text, q)
    return om, text


def negotiate(accept: str | None) -> tuple[bool, str]:
    """Return (openmetrics?, content type) for an Accept header; text unless OM is preferred."""
    if not accept:
        return False, CONTENT_TYPE_TEXT
    om, text = _accept_quality(accept)
    if om > 0 and om >= text:
        return True, CONTENT_TYPE_OPENMETRICS
    return False, CONTENT_TYPE_TEXT


def wants_gzip(accept_encoding: str | None) -> bool:
    """Whether an Accept-Encoding header accepts gzip (names it, and not with q=0)."""
    for item in (accept_encoding or "").split(","):
        parts = [p.strip(_BLANKS) for p in item.split(";")]
        if parts[0].lower() == "gzip":
            return _quality(parts[1:]) > 0
    return False
