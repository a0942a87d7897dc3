"""The OpenAI-compatible HTTP frontend in front of Triton (``python -m runtime.frontend``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.frontend.app import create_app
    from runtime.frontend.settings import FrontendSettings

__all__ = ["FrontendSettings", "create_app"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: the packaging code and the entrypoint import the tensor table
    # (runtime.frontend.tensors) and must not pay for FastAPI and tritonclient.
    if name == "create_app":
        from runtime.frontend.app import create_app

        return create_app
    if name == "FrontendSettings":
        from runtime.frontend.settings import FrontendSettings

        return FrontendSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
