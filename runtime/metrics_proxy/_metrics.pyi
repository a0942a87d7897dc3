"""
The metrics proxy's native merge: .db files, Triton's text, the body and gzip.
"""

from __future__ import annotations

import collections.abc
import typing

class DirectoryError(OSError):
    pass

class ExpositionParseError(ValueError):
    pass

class FamilyList:
    """
    Families read from the .db files or from Triton.
    """
    @staticmethod
    def of(families: collections.abc.Iterable) -> FamilyList:
        """
        A list of Python Family objects, as a source to add().
        """
    def families(self) -> list:
        """
        Every family as (name, type, help, [(sample, labels, value), ...]).
        """
    def names(self) -> list:
        """
        Family names, in order.
        """
    @property
    def corrupt_files(self) -> tuple:
        """
        'name: reason' per .db file skipped as truncated or corrupt.
        """
    @property
    def files(self) -> int:
        """
        Files merged (a .db read).
        """

class MultiprocReader:
    """
    Merges a PROMETHEUS_MULTIPROC_DIR as MultiProcessCollector.
    """
    def __init__(self, directory: str) -> None: ...
    def read(self) -> FamilyList:
        """
        Merge every *.db file; raises DirectoryError (an OSError) if the directory cannot be listed.
        """

class TextParser:
    """
    Parses one endpoint's Prometheus text, caching its series.
    """
    def __init__(self) -> None: ...
    def parse(self, body: bytes) -> FamilyList:
        """
        Parse Prometheus text 0.0.4; raises ExpositionParseError (a ValueError).
        """

class Encoder:
    """
    The pod's constant labels and the series text cache.
    """
    def __init__(self, constant_labels: collections.abc.Sequence[tuple[str, str]]) -> None: ...

class BodyWriter:
    """
    One exposition body: reserve(own), add(source)..., add_reserved(own), finish().
    """
    def __init__(self, encoder: Encoder, openmetrics: bool, gzip: bool) -> None: ...
    def add(self, families: FamilyList) -> int:
        """
        Write a source's families; returns how many it hid (names an earlier one had).
        """
    def add_reserved(self, families: FamilyList) -> None:
        """
        Write the reserved families.
        """
    def finish(self) -> bytes:
        """
        The body (gzipped if asked); the writer is spent.
        """
    def reserve(self, families: FamilyList) -> None:
        """
        Claim these families' names (and sample names) ahead of every source.
        """

class HttpFetcher:
    """
    GETs one URL over kept-alive HTTP/1.1 within a time and size bound.
    """
    def __init__(
        self,
        host: str,
        port: typing.SupportsInt | typing.SupportsIndex,
        path: str,
        timeout_s: typing.SupportsFloat | typing.SupportsIndex,
        max_bytes: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    def fetch(self) -> bytes:
        """
        The body; raises TritonScrapeError(reason, message).
        """

class ScrapeServer:
    """
    The proxy's HTTP server: /metrics merged natively, /healthz, each source's health.
    """
    def __init__(
        self,
        host: str,
        port: typing.SupportsInt | typing.SupportsIndex,
        reuse_s: typing.SupportsFloat | typing.SupportsIndex,
        idle_timeout_s: typing.SupportsFloat | typing.SupportsIndex,
        triton_host: str,
        triton_port: typing.SupportsInt | typing.SupportsIndex,
        triton_path: str,
        triton_timeout_s: typing.SupportsFloat | typing.SupportsIndex,
        triton_max_bytes: typing.SupportsInt | typing.SupportsIndex,
        directory: str,
        constant_labels: collections.abc.Sequence[tuple[str, str]],
        warn: collections.abc.Callable,
        prepare: collections.abc.Callable | None,
    ) -> None: ...
    def start(self) -> int:
        """
        Bind and serve from two native threads; returns the bound port.
        """
    def stop(self, grace_s: typing.SupportsFloat | typing.SupportsIndex) -> None:
        """
        Close the listener, answer the scrapes in flight for up to grace_s, then end.
        """

def wants_gzip(accept_encoding: str) -> bool:
    """
    Whether an Accept-Encoding header accepts gzip (the server's negotiation).
    """

def wants_openmetrics(accept: str) -> bool:
    """
    Whether an Accept header prefers OpenMetrics (the server's negotiation).
    """
