"""The OpenAI-compatible HTTP frontend in front of Triton (``python -m runtime.frontend``)."""

from runtime.frontend.app import create_app
from runtime.frontend.settings import FrontendSettings

__all__ = ["FrontendSettings", "create_app"]
