"""The entrypoint's settings, read from the pod's environment (contract 5 names and ports)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.settings_env import variable_for

__all__ = ["EntrypointSettings"]

Port = Annotated[int, Field(ge=1, le=65535)]
"""A TCP port the pod binds or connects to: a fixed one, since probes and peers name it."""
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A finite duration; ``inf`` would overflow where it becomes an int or a timer."""
# Triton reads --exit-timeout-secs (the drain deadline, rounded) into a C int.
_MAX_DRAIN_SECONDS = 2**31 - 1


#: The ports the pod's servers bind, in field order (a validator sees only earlier fields).
_PORTS = (
    "public_grpc_port",
    "triton_http_port",
    "triton_metrics_port",
    "frontend_port",
    "health_port",
)


def _overlaps(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one folder or one is inside the other (links resolved)."""
    a, b = Path(os.path.realpath(a)), Path(os.path.realpath(b))
    return a == b or a in b.parents or b in a.parents


class EntrypointSettings(BaseSettings):
    """Everything the entrypoint reads; every port and path is configurable."""

    model_config = SettingsConfigDict(env_prefix="LLM_SERVING_", extra="ignore")

    package_path: Path | None = Field(
        default=None, description="version folder on the model cache (has manifest.json)"
    )
    model_cache_root: Path = Field(
        default=Path("/mnt/model-cache/models"),
        description="where <model_id>/<model_version>/ live when LLM_SERVING_PACKAGE_PATH is "
        "not set",
    )
    package_s3_uri: str | None = Field(
        default=None, description="s3://bucket/models/<id>/<version>/: fallback, slow cold start"
    )
    model_id: str | None = Field(
        default=None,
        description="expected model id (checked); with LLM_SERVING_MODEL_VERSION, names the "
        "version folder under LLM_SERVING_MODEL_CACHE_ROOT",
    )
    model_version: str | None = Field(default=None, description="expected model version")
    work_dir: Path = Field(
        default=Path("/var/lib/llm-serving"), description="local disk for unpack and repository"
    )
    verify_weights: bool = Field(
        default=False,
        description="hash the weights at start too (on the model cache the materialize Job's "
        "verify container already did; sizes are checked)",
    )
    max_unpack_bytes: int = Field(default=64 << 30, description="unpack size ceiling")
    plugin_dir: Path | None = Field(
        default=None,
        description="install plugins into this folder (on Triton's PYTHONPATH) instead of "
        "the image's site-packages; emptied at each start, so it must be empty or one this "
        "entrypoint filled before",
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
    instance_kind: Literal["auto", "gpu", "model"] = Field(
        default="auto",
        description="Triton instance kind of vllm models: auto is KIND_GPU for a one-GPU "
        "engine (Triton pins its device) and KIND_MODEL for a multi-GPU one; model lets the "
        "engine place itself, as where Triton sees no GPU (it refuses KIND_GPU there)",
    )
    serving_mode: Literal["standalone", "embedded"] | None = Field(
        default=None, description="override the manifest's serving mode (standalone|embedded)"
    )
    frontend_command: str = Field(
        default="python3 -m runtime.frontend", description="OpenAI frontend command (embedded)"
    )
    gate: str | None = Field(
        default=None,
        description="removed with the relay gate (Triton binds the public gRPC port once its "
        "model has loaded); refused if set",
    )
    public_host: str = Field(default="0.0.0.0", description="address of the public gRPC port")
    public_grpc_port: Port = Field(
        default=8001,
        description="public KServe gRPC port: Triton's own, bound once the model has loaded",
    )
    triton_grpc_port: str | None = Field(
        default=None,
        description="removed with the relay gate (Triton's gRPC endpoint is the public port); "
        "refused if set",
    )
    triton_http_port: Port = Field(default=18000, description="Triton's HTTP port, loopback")
    triton_metrics_port: Port = Field(default=8002, description="Triton's metrics port")
    frontend_port: Port = Field(default=8080, description="OpenAI frontend port (embedded)")
    health_host: str = Field(default="0.0.0.0", description="address of the health port")
    health_port: Port = Field(default=8081, description="/livez, /readyz, /metrics")
    ready_timeout_seconds: Seconds = Field(
        default=1800.0, gt=0, description="seconds the model may take to become ready (stage 8)"
    )
    drain_seconds: Seconds = Field(
        default=30.0, le=_MAX_DRAIN_SECONDS, description="SIGTERM drain deadline"
    )
    readiness_poll_seconds: Seconds = Field(
        default=2.0, gt=0, description="how often readiness is re-checked while serving"
    )

    @field_validator("gate", "triton_grpc_port")
    @classmethod
    def _removed(cls, value: str | None) -> None:
        # A leftover from a pod spec written for the relay gate: say so rather than ignore it.
        if value is not None:
            raise ValueError(
                "this variable was removed with the relay gate: Triton binds the public gRPC "
                "port (LLM_SERVING_PUBLIC_GRPC_PORT) itself once its model has loaded; remove "
                "the variable from the pod spec"
            )

    @field_validator("tritonserver", "frontend_command")
    @classmethod
    def _command(cls, value: str) -> str:
        # Split now, so that a bad command is refused before any stage runs rather than when
        # stage 7 starts the server, after the package was unpacked and rendered.
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise ValueError(
                f"cannot split it into shell words ({exc}); close the quote or escape it"
            ) from None
        if not words:
            raise ValueError("it names no command; set the program to run, or unset it")
        return value

    @field_validator(*_PORTS)
    @classmethod
    def _distinct_port(cls, value: int, info: ValidationInfo) -> int:
        # Each is bound by one server of this pod (the health server is the entrypoint's own),
        # so a shared port fails at start, blaming whichever binds second. Earlier ports are
        # in info.data, so the variable named last in _PORTS is the one reported.
        for other in _PORTS:
            if other == info.field_name:
                break
            if info.data.get(other) == value:
                variable = variable_for(cls, other)
                raise ValueError(f"port {value} is also {variable}; give each port its own number")
        return value

    @field_validator("multiproc_dir")
    @classmethod
    def _own_multiproc_dir(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        # Stage 4 deletes files there, stages 2 and 3 fill the work and plugin folders.
        if value is None:
            return value
        for name, other in (
            ("LLM_SERVING_WORK_DIR", info.data.get("work_dir")),
            ("LLM_SERVING_PLUGIN_DIR", info.data.get("plugin_dir")),
        ):
            if other is not None and _overlaps(value, other):
                raise ValueError(
                    f"{value} overlaps {name} {other} (the same folder, or one inside the "
                    "other); point it at an emptyDir of its own"
                )
        return value

    def version_folder(self) -> Path | None:
        """The version folder: ``package_path``, else derived from the model id and version."""
        if self.package_path is not None:
            return self.package_path
        if self.model_id and self.model_version:
            return self.model_cache_root / self.model_id / self.model_version
        return None

    def public_grpc_target(self) -> tuple[str, int]:
        """Where this pod reaches its own public gRPC port (Triton's)."""
        wildcard = self.public_host in ("0.0.0.0", "::", "")
        return ("127.0.0.1" if wildcard else self.public_host), self.public_grpc_port

    def public_grpc_url(self) -> str:
        """`public_grpc_target` as a gRPC ``host:port`` (an IPv6 address in brackets)."""
        host, port = self.public_grpc_target()
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def tritonserver_argv(self) -> list[str]:
        """The tritonserver command as argv words."""
        return shlex.split(self.tritonserver)

    def frontend_argv(self) -> list[str]:
        """The frontend command as argv words."""
        return shlex.split(self.frontend_command)
