"""The proxy's policy: per-source health and its own families, which the native server
(``_metrics.ScrapeServer``: HTTP, Triton's fetch, the merge) asks for once per merge."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from runtime.metrics_proxy import _metrics
from runtime.metrics_proxy.exposition import Family, Sample
from runtime.metrics_proxy.multiproc import mark_dead_processes
from runtime.metrics_proxy.settings import ProxySettings

__all__ = ["ERROR_REASONS", "MetricsProxyApp", "ProxyConfigError", "create_app"]

log = logging.getLogger(__name__)

TRITON, VLLM = "triton", "vllm"
ERROR_REASONS = {
    TRITON: ("connect", "timeout", "http_status", "too_large", "parse", "internal"),
    VLLM: ("read_dir", "corrupt_file", "internal"),
}
"""Error counter label values per source, exposed at 0 from the start so rate() works."""


class ProxyConfigError(ValueError):
    """The proxy's environment is unusable; the message names the variable to set."""


@dataclass
class _SourceState:
    up: bool = False
    duration_s: float = 0.0
    errors: dict[str, float] = field(default_factory=dict)
    last_error: str = ""


class MetricsProxyApp:
    """Per-source health, fed by the native server's merges, and the server's lifecycle."""

    def __init__(self, settings: ProxySettings) -> None:
        if settings.multiproc_dir is None:
            raise ProxyConfigError(
                "PROMETHEUS_MULTIPROC_DIR is not set: point it (or METRICS_PROXY_MULTIPROC_DIR) "
                "at the directory vLLM writes its multiprocess metrics to"
            )
        parts = urlsplit(settings.triton_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ProxyConfigError(
                "METRICS_PROXY_TRITON_URL: Triton's metrics URL must be http://host[:port]/path, "
                f"got {settings.triton_url!r}"
            )
        self.settings = settings
        self._triton = (
            parts.hostname,
            parts.port or 80,
            (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
        )
        self._state = {
            source: _SourceState(errors=dict.fromkeys(reasons, 0.0))
            for source, reasons in ERROR_REASONS.items()
        }
        self._corrupt_seen: tuple[str, ...] = ()
        self._files = 0
        self._corrupt = 0
        self._dropped = 0
        self._server: Any = None

    def start(self) -> int:
        """Start the native server on ``settings.host:settings.port``; the bound port."""
        s = self.settings
        host, port, path = self._triton
        self._server = _metrics.ScrapeServer(
            host=s.host,
            port=s.port,
            reuse_s=s.reuse_s,
            idle_timeout_s=s.idle_timeout_s,
            triton_host=host,
            triton_port=port,
            triton_path=path,
            triton_timeout_s=s.triton_timeout_s,
            triton_max_bytes=s.triton_max_bytes,
            directory=str(s.multiproc_dir),
            constant_labels=list(s.constant_labels()),
            # Names are all that is reserved: the proxy's own families hide any source's.
            own_layout=_metrics.FamilyList.of(self._own_families()),
            record=self.record,
            prepare=self._mark_dead if s.mark_dead_processes else None,
            health=lambda: json.dumps(self.health()),
        )
        return self._server.start()

    def stop(self, grace_s: float = 0.0) -> None:
        """Stop accepting, answer the scrapes in flight for up to ``grace_s``, end."""
        if self._server is not None:
            self._server.stop(grace_s)
            self._server = None

    def _mark_dead(self) -> None:
        mark_dead_processes(self.settings.multiproc_dir)  # type: ignore[arg-type]

    def _fail(self, source: str, reason: str, message: str) -> None:
        state = self._state[source]
        state.errors[reason] = state.errors.get(reason, 0.0) + 1
        if state.up or message != state.last_error:
            log.warning("metrics source %s failed (%s): %s", source, reason, message)
        state.up, state.last_error = False, message

    def record(self, outcome: dict[str, Any]) -> _metrics.FamilyList:
        """Update each source's health from one merge; the proxy's own families for its body."""
        triton, vllm = self._state[TRITON], self._state[VLLM]
        if outcome["triton_ok"]:
            triton.up, triton.last_error = True, ""
            self._dropped = outcome["duplicates"]
        else:
            self._fail(TRITON, outcome["triton_reason"], outcome["triton_message"])
            self._dropped = 0
        triton.duration_s = outcome["triton_seconds"]
        if outcome["vllm_ok"]:
            corrupt = outcome["corrupt"]
            self._files, self._corrupt = outcome["files"], len(corrupt)
            vllm.up, vllm.last_error = True, ""
            vllm.errors["corrupt_file"] += len(corrupt)
            if corrupt != self._corrupt_seen:  # log changes, not every scrape
                self._corrupt_seen = corrupt
                if corrupt:
                    log.warning("skipping corrupt files: %s", "; ".join(corrupt))
        else:
            self._fail(VLLM, outcome["vllm_reason"], outcome["vllm_message"])
            self._files = self._corrupt = 0
        vllm.duration_s = outcome["vllm_seconds"]
        return _metrics.FamilyList.of(self._own_families())

    def _own_families(self) -> list[Family]:
        def gauge(name: str, help_text: str, samples: list[Sample]) -> Family:
            return Family(name, "gauge", help_text, samples)

        st = self._state
        return [
            gauge(
                "metrics_proxy_source_up",
                "1 if the source was read in the last scrape, 0 if not.",
                [Sample("metrics_proxy_source_up", (("source", s),), float(st[s].up)) for s in st],
            ),
            gauge(
                "metrics_proxy_source_scrape_duration_seconds",
                "Time the last scrape spent reading the source.",
                [
                    Sample(
                        "metrics_proxy_source_scrape_duration_seconds",
                        (("source", s),),
                        st[s].duration_s,
                    )
                    for s in st
                ],
            ),
            Family(
                "metrics_proxy_source_errors",
                "counter",
                "Failed reads of a source (corrupt_file: per skipped file), by reason.",
                [
                    Sample("metrics_proxy_source_errors_total", (("source", s), ("reason", r)), v)
                    for s in st
                    for r, v in st[s].errors.items()
                ],
            ),
            gauge(
                "metrics_proxy_multiproc_files",
                "Multiprocess .db files merged in the last scrape.",
                [Sample("metrics_proxy_multiproc_files", (), float(self._files))],
            ),
            gauge(
                "metrics_proxy_multiproc_corrupt_files",
                "Multiprocess .db files skipped as truncated or corrupt in the last scrape.",
                [Sample("metrics_proxy_multiproc_corrupt_files", (), float(self._corrupt))],
            ),
            gauge(
                "metrics_proxy_duplicate_families",
                "Triton families hidden because vLLM's multiprocess files carry them complete.",
                [Sample("metrics_proxy_duplicate_families", (), float(self._dropped))],
            ),
        ]

    def health(self) -> dict[str, Any]:
        """The proxy is healthy while it serves; source health is reported, not required."""
        return {"status": "ok", "sources": {s: st.up for s, st in self._state.items()}}


def create_app(settings: ProxySettings) -> MetricsProxyApp:
    """Build the proxy for ``settings``; raises ``ProxyConfigError`` naming what to set."""
    return MetricsProxyApp(settings)
