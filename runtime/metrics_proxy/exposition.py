"""Metric families as the proxy holds them, and their Prometheus text and OpenMetrics encodings.

The proxy writes both formats itself: ``prometheus_client``'s encoders rename counters that
lack ``_total`` (all of Triton's) and escape ``:`` in OpenMetrics, which would change the
series names that the dashboards and alerts query.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field

from prometheus_client.utils import floatToGoString

__all__ = [
    "CONTENT_TYPE_OPENMETRICS",
    "CONTENT_TYPE_TEXT",
    "Family",
    "LabelSet",
    "Sample",
    "encode",
    "gzip_body",
    "negotiate",
    "wants_gzip",
]

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"

LabelSet = tuple[tuple[str, str], ...]
"""Label pairs in the order they are written."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One series value; ``name`` is the full sample name (``x_bucket``, ``x_total``, ...)."""

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


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels_text(labels: LabelSet) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels) + "}"


def _counter_has_total(family: Family) -> bool:
    total = family.name + "_total"
    return all(s.name in (total, family.name + "_created") for s in family.samples)


def _encode_text(families: list[Family]) -> bytes:
    out: list[str] = []
    for fam in families:
        name, typ = fam.name, fam.type
        if typ == "counter" and _counter_has_total(fam):
            name += "_total"
        elif typ == "unknown":
            typ = "untyped"
        help_text = fam.help.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {typ}\n")
        out.extend(
            f"{s.name}{_labels_text(s.labels)} {floatToGoString(s.value)}\n"
            for s in fam.samples
            if not s.name.endswith("_created")
        )
    return "".join(out).encode("utf-8")


def _encode_openmetrics(families: list[Family]) -> bytes:
    out: list[str] = []
    for fam in families:
        name, typ = fam.name, fam.type
        if typ == "untyped":
            typ = "unknown"
        if typ == "counter" and not _counter_has_total(fam):
            # OpenMetrics counters must end in _total; Triton's do not. Declaring them
            # `unknown` keeps the series names the queries use and the output valid.
            typ = "unknown"
            name = fam.samples[0].name if fam.samples else fam.name
        help_text = fam.help.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {typ}\n")
        out.extend(
            f"{s.name}{_labels_text(s.labels)} {floatToGoString(s.value)}\n" for s in fam.samples
        )
    out.append("# EOF\n")
    return "".join(out).encode("utf-8")


def encode(families: list[Family], openmetrics: bool) -> bytes:
    """Encode families as OpenMetrics 1.0 or as Prometheus text 0.0.4."""
    return _encode_openmetrics(families) if openmetrics else _encode_text(families)


def _accept_quality(accept: str) -> tuple[float, float]:
    """Highest q for OpenMetrics and for plain text in an Accept header."""
    om = text = 0.0
    for item in accept.split(","):
        parts = [p.strip() for p in item.split(";")]
        media, q = parts[0].lower(), 1.0
        for param in parts[1:]:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
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
    """Whether an Accept-Encoding header accepts gzip (and does not refuse it with q=0)."""
    for item in (accept_encoding or "").split(","):
        parts = [p.strip() for p in item.split(";")]
        if parts[0].lower() == "gzip":
            return not any(p.replace(" ", "") in ("q=0", "q=0.0") for p in parts[1:])
    return False


def gzip_body(body: bytes) -> bytes:
    """Compress fast: scrapes are frequent and bodies compress well even at level 1."""
    return gzip.compress(body, compresslevel=1, mtime=0)
