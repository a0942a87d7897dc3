"""Frontend settings (pydantic-settings, environment prefix ``LLM_SERVING_FRONTEND_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.deadlines import FRONTEND_REQUEST_TIMEOUT_S

__all__ = ["FrontendSettings"]


class FrontendSettings(BaseSettings):
    """Everything the OpenAI frontend needs to know; read once at start-up, never at import."""

    model_config = SettingsConfigDict(env_prefix="LLM_SERVING_FRONTEND_", extra="forbid")

    triton_url: str = Field(
        default="127.0.0.1:8001", description="KServe v2 gRPC address of Triton (host:port)."
    )
    model_name: str = Field(default="llm", description="Triton model name that serves requests.")
    served_model_id: str | None = Field(
        default=None,
        description="Model id clients send and /v1/models lists; default the model name.",
    )
    tokenizer_dir: Path | None = Field(
        default=None,
        description="Folder with the model's tokenizer_config.json (chat template).",
    )
    triton_release: str | None = Field(
        default=None,
        description="Triton release to take the pinned pair from; default the matrix's.",
    )
    structured_outputs_key: Literal["guided_decoding", "structured_outputs"] | None = Field(
        default=None,
        description="Override of the structured-output key; default from images/compat.toml.",
    )
    tool_call_parser: Literal["hermes"] | None = Field(
        default=None, description="How the model writes tool calls; tools are refused without one."
    )
    api_keys_file: Path | None = Field(
        default=None,
        description="File of SHA-256 hex digests of accepted API keys, one per line; none = open.",
    )
    max_request_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, description="Body limit.")
    request_timeout_s: float = Field(
        default=FRONTEND_REQUEST_TIMEOUT_S, gt=0, description="Per-request deadline."
    )
    max_concurrent_streams: int = Field(
        default=256, ge=1, description="Open streams beyond this are answered 429."
    )
    embedding_size: int | None = Field(
        default=None,
        ge=1,
        description="Embedding width; default hidden_size from config.json in the tokenizer dir.",
    )
    max_choices: int = Field(
        default=256, ge=1, description="Most choices (prompts x n) one completion request may ask."
    )
    host: str = Field(default="0.0.0.0", description="Address uvicorn binds.")
    port: int = Field(default=8080, ge=0, le=65535, description="Port uvicorn binds.")
    keep_alive_s: int = Field(
        default=75,
        ge=1,
        description="Idle keep-alive connections are closed after this; above clients' pool "
        "expiry (the openai SDK's is 5 s), else a request can reuse a connection as it closes.",
    )
    max_logprobs: int = Field(
        default=20,
        ge=-1,
        description="The engine's max_logprobs (vLLM's default 20; -1 for no cap), which the "
        "entrypoint passes where the package's engine_args set it.",
    )
    # Required, and last so that other settings' errors lead the one-line report.
    max_model_len: int = Field(
        ge=1,
        description="Context length of the model: the package manifest's max_model_len, which "
        "the entrypoint passes (the frontend has no default of its own).",
    )

    @property
    def model_id(self) -> str:
        return self.served_model_id or self.model_name
