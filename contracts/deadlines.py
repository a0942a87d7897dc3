"""How long one request may run in a serving pod, for the frontend that enforces it and the
Gateway routes that must outlast it."""

from __future__ import annotations

__all__ = ["FRONTEND_REQUEST_TIMEOUT_S"]

FRONTEND_REQUEST_TIMEOUT_S = 600.0
"""The OpenAI frontend's default per-request deadline (``LLM_SERVING_FRONTEND_REQUEST_TIMEOUT_S``,
which the pods do not set)."""
