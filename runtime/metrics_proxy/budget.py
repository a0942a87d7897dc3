"""The scrape timeout Prometheus sends with each scrape, read as a bound on the wait for Triton.

Prometheus sends its ``scrape_timeout`` as ``X-Prometheus-Scrape-Timeout-Seconds``, a decimal
number of seconds (Go's ``FormatFloat(t, 'f', -1, 64)``: ``10``, ``0.5``), and gives up on the
whole scrape when it runs out. Like blackbox_exporter's ``--timeout-offset`` (0.5 s), the proxy
keeps a margin of it for reading vLLM's files and answering, and cuts Triton's fetch at the rest.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["SCRAPE_TIMEOUT_HEADER", "ScrapeBudget", "scrape_budget"]

SCRAPE_TIMEOUT_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"

# A plain decimal, as Prometheus writes it (an exponent allowed): no sign, NaN, infinity, hex,
# underscores or non-ASCII digits, all of which float() would take.
_SECONDS = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


@dataclass(frozen=True)
class ScrapeBudget:
    """One scrape's timeout as the scraper sent it, and the part of it kept for answering."""

    timeout_s: float
    """The header's value: the scraper gives up this long after sending the request."""
    margin_s: float
    """Kept for reading vLLM's files, merging and sending the body."""

    @property
    def wait_s(self) -> float:
        """How long the scrape may wait for Triton: the timeout less the margin (positive)."""
        return self.timeout_s - self.margin_s


def scrape_budget(value: str | None, offset_s: float) -> ScrapeBudget | None:
    """The budget a scrape's ``X-Prometheus-Scrape-Timeout-Seconds`` value gives, or ``None``
    where it gives none: absent, not a plain decimal (negative, NaN, infinite), zero, or too
    large to be finite. Such a scrape waits for Triton as long as the configured timeout allows.

    The margin is ``offset_s``, or half the timeout where that is less, so that a timeout no
    longer than the offset still leaves a wait (blackbox_exporter falls back to its module's
    timeout there instead, which may be longer than the scraper waits).
    """
    if value is None or not _SECONDS.fullmatch(value.strip(" \t")):
        return None
    timeout_s = float(value)
    if not 0 < timeout_s < math.inf:
        return None
    return ScrapeBudget(timeout_s, min(offset_s, timeout_s / 2))
