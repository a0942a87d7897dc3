"""``GET /v1/models``: the one model this frontend serves."""

from __future__ import annotations

from fastapi import APIRouter

from runtime.frontend.dependencies import AuthDep, SettingsDep
from runtime.frontend.errors import error_responses

__all__ = ["router"]

router = APIRouter(tags=["models"])


@router.get("/v1/models", responses=error_responses(401))
async def list_models(_: AuthDep, settings: SettingsDep) -> dict:
    """List the served model."""
    return {
        "object": "list",
        "data": [
            {"id": settings.model_id, "object": "model", "created": 0, "owned_by": "llm-serving"}
        ],
    }
