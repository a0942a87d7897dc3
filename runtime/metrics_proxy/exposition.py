"""Content negotiation and the two encodings, both written by ``prometheus_client``'s encoders.

OpenMetrics is encoded with ``escaping=allow-utf-8``: the default (``underscores``) would rewrite
the ``:`` of every ``vllm:*`` sample name to ``_``, while ``:`` is valid in the legacy name
charset and needs no quoting, so the names the dashboards query stay as vLLM wrote them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from prometheus_client import exposition as text_format
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics_format

__all__ = [
    "CONTENT_TYPE_OPENMETRICS",
    "CONTENT_TYPE_TEXT",
    "encode",
    "negotiate",
    "wants_gzip",
]

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class _Families:
    """The ``collect()`` that prometheus_client's encoders take, over families already built."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def encode(families: Iterable[Metric], openmetrics: bool) -> bytes:
    """OpenMetrics 1.0 (ending in ``# EOF``) or Prometheus text 0.0.4 of ``families``."""
    if openmetrics:
        return openmetrics_format.generate_latest(
            _Families(families), escaping=openmetrics_format.ALLOWUTF8
        )
    return text_format.generate_latest(_Families(families), escaping=openmetrics_format.ALLOWUTF8)


# An RFC 9110 qvalue: "0" or "1", then at most three decimals, at most 1.
_QVALUE = re.compile(r"0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?")
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
    """Return (openmetrics?, content type) for an Accept header; text unless OM is preferred.

    prometheus_client's ``choose_encoder`` ignores q-values, so a client that weighs
    OpenMetrics below text would get OpenMetrics; this honours them.
    """
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
