"""The entrypoint's settings, read from the pod's environment (contract 5 names and ports)."""

from __future__ import annotations

import shlex
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["EntrypointSettings"]


class EntrypointSettings(BaseSettings):
    """Everything the entrypoint reads; every port and path is configurable."""

    model_config = SettingsConfigDict(env_prefix="LLM_SERVING_", extra="ignore")

    package_path: Path | None = Field(
        default=None, description="version folder on the model cache (has manifest.json)"
    )
    model_cache_root: Path = Field(
        default=Path("/mnt/model-cache/models"),
        description="where <model_id>/<model_version>/ live when package_path is not set",
    )
    package_s3_uri: str | None = Field(
        default=None, description="s3://bucket/models/<id>/<version>/: fallback, slow cold start"
    )
    model_id: str | None = Field(default=None, description="expected model id (checked)")
    model_version: str | None = Field(default=None, description="expected model version")
    work_dir: Path = Field(
        default=Path("/var/lib/llm-serving"), description="local disk for unpack and repository"
    )
    verify_weights: bool = Field(
        default=False,
        description="hash the weights at start (the restore Job already did; sizes are checked)",
    )
    max_unpack_bytes: int = Field(default=64 << 30, description="unpack size ceiling")
    plugin_dir: Path | None = Field(
        default=None,
        description="install plugins into this folder (on Triton's PYTHONPATH) instead of "
        "the image's site-packages",
    )
    constraints_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("LLM_SERVING_CONSTRAINTS_FILE", "PIP_CONSTRAINT"),
        description="the image's pip constraints (PIP_CONSTRAINT)",
    )
    multiproc_dir: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("PROMETHEUS_MULTIPROC_DIR"),
        description="prometheus_client multiprocess folder shared with the metrics proxy",
    )
    triton_release: str | None = Field(
        default=None,
        validation_alias=AliasChoices("LLM_SERVING_TRITON_RELEASE", "NVIDIA_TRITON_SERVER_VERSION"),
        description="Triton release of this image (YY.MM)",
    )
    compat_matrix: Path | None = Field(default=None, description="compat.toml override")
    logits_processor: str = Field(
        default="runtime.constraints.plugin:ConstraintProcessorEntryPoint",
        description="our vLLM logits processor, module:Class, added to model.json",
    )
    tritonserver: str = Field(
        default="tritonserver", description="tritonserver command (shell words)"
    )
    serving_mode: str | None = Field(
        default=None, description="override the manifest's serving mode (standalone|embedded)"
    )
    frontend_command: str = Field(
        default="python3 -m runtime.frontend", description="OpenAI frontend command (embedded)"
    )
    public_host: str = Field(default="0.0.0.0", description="address of the public gRPC port")
    public_grpc_port: int = Field(default=8001, description="public KServe gRPC port (gated)")
    triton_grpc_port: int = Field(default=18001, description="Triton's gRPC port, loopback")
    triton_http_port: int = Field(default=18000, description="Triton's HTTP port, loopback")
    triton_metrics_port: int = Field(default=8002, description="Triton's metrics port")
    frontend_port: int = Field(default=8080, description="OpenAI frontend port (embedded)")
    health_host: str = Field(default="0.0.0.0")
    health_port: int = Field(default=8081, description="/livez, /readyz, /metrics")
    ready_timeout_seconds: float = Field(default=1800.0, gt=0)
    drain_seconds: float = Field(default=30.0, ge=0, description="SIGTERM drain deadline")
    readiness_poll_seconds: float = Field(
        default=2.0, gt=0, description="how often readiness is re-checked while serving"
    )

    def version_folder(self) -> Path | None:
        """The version folder: ``package_path``, else derived from the model id and version."""
        if self.package_path is not None:
            return self.package_path
        if self.model_id and self.model_version:
            return self.model_cache_root / self.model_id / self.model_version
        return None

    def tritonserver_argv(self) -> list[str]:
        """The tritonserver command as argv words."""
        return shlex.split(self.tritonserver)

    def frontend_argv(self) -> list[str]:
        """The frontend command as argv words."""
        return shlex.split(self.frontend_command)
