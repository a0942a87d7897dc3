"""The proxy's configuration, read from the serving pod's environment."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ProxySettings"]


class ProxySettings(BaseSettings):
    """Where to listen, where the two sources are, and the labels every series gets."""

    model_config = SettingsConfigDict(
        env_prefix="METRICS_PROXY_", frozen=True, populate_by_name=True, protected_namespaces=()
    )

    host: str = Field("0.0.0.0", description="Address to listen on (the pod IP is scraped).")
    port: int = Field(9400, ge=0, le=65535, description="Port of /metrics and /healthz.")
    triton_url: str = Field(
        "http://127.0.0.1:8002/metrics", description="Triton's metrics endpoint (loopback)."
    )
    triton_timeout_s: float = Field(
        2.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Whole-request bound on Triton's fetch; a slow Triton is down. A scrape's own "
            "timeout (see scrape_timeout_offset_s) may cut it shorter."
        ),
    )
    scrape_timeout_offset_s: float = Field(
        0.5,
        ge=0,
        allow_inf_nan=False,
        description=(
            "Part of the scrape timeout Prometheus sends (X-Prometheus-Scrape-Timeout-Seconds) "
            "kept for answering (at most half of it): Triton's fetch is cut at the rest, so a "
            "slow Triton fails its own source instead of the whole scrape."
        ),
    )
    triton_max_bytes: int = Field(
        4 << 20, gt=0, description="Largest Triton exposition accepted, bounding memory."
    )
    multiproc_dir: Path | None = Field(
        None,
        validation_alias=AliasChoices("METRICS_PROXY_MULTIPROC_DIR", "PROMETHEUS_MULTIPROC_DIR"),
        description="vLLM's prometheus_client multiprocess directory.",
    )
    mark_dead_processes: bool = Field(
        False,
        description=(
            "Call prometheus_client's mark_process_dead for live* gauge files whose process "
            "is gone. Only correct when the pod shares one process namespace."
        ),
    )
    model_id: str = Field(
        "",
        validation_alias="LLM_SERVING_MODEL_ID",
        description="model_id label of every series (none if empty).",
    )
    model_version: str = Field(
        "",
        validation_alias="LLM_SERVING_MODEL_VERSION",
        description="model_version label of every series (none if empty).",
    )
    colour: str = Field(
        "",
        validation_alias="LLM_SERVING_COLOUR",
        description="colour label of every series (none if empty).",
    )
    # Finite durations only: an infinite one would serve one merge forever, wait forever on a
    # scrape at shutdown, or never close an idle connection.
    reuse_s: float = Field(
        0.1,
        ge=0,
        allow_inf_nan=False,
        description="A merge this recent is served again to the next scrapes (0: never).",
    )
    graceful_shutdown_s: float = Field(
        5.0, ge=0, allow_inf_nan=False, description="Wait for in-flight scrapes."
    )
    idle_timeout_s: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="A kept-alive scraper connection idle this long is closed.",
    )

    def constant_labels(self) -> tuple[tuple[str, str], ...]:
        """``model_id``, ``model_version``, ``colour`` as set (empty ones are left out)."""
        pairs = (
            ("model_id", self.model_id),
            ("model_version", self.model_version),
            ("colour", self.colour),
        )
        return tuple((k, v) for k, v in pairs if v)
