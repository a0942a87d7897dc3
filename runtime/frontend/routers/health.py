"""``/health/live`` and ``/health/ready`` (no API key: probes carry none)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from runtime.frontend.dependencies import EngineDep
from runtime.frontend.errors import error_responses

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/health/live")
async def live() -> dict[str, str]:
    """The process is serving HTTP."""
    return {"status": "live"}


# Its 503 is the probe's answer, not an error: {"status": "not ready"}.
@router.get(
    "/health/ready",
    responses={**error_responses(), 503: {"description": "Triton or the model not ready"}},
)
async def ready(engine: EngineDep) -> JSONResponse:
    """Triton and the model answer ready over gRPC."""
    if await engine.ready():
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not ready"}, status_code=503)
