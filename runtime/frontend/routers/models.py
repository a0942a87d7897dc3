"""``GET /v1/models`` and ``GET /v1/models/{model}``: the one model this frontend serves."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from runtime.frontend.dependencies import AuthDep, SettingsDep, check_model
from runtime.frontend.errors import error_responses
from runtime.frontend.settings import FrontendSettings

__all__ = ["router"]

router = APIRouter(tags=["models"])


def _card(settings: FrontendSettings) -> dict[str, Any]:
    # max_model_len as vLLM's server adds it: clients size their prompts by it.
    return {
        "id": settings.model_id,
        "object": "model",
        "created": 0,
        "owned_by": "llm-serving",
        "max_model_len": settings.max_model_len,
    }


@router.get("/v1/models", responses=error_responses(401))
async def list_models(_: AuthDep, settings: SettingsDep) -> dict:
    """List the served model."""
    return {"object": "list", "data": [_card(settings)]}


@router.get("/v1/models/{model:path}", responses=error_responses(401, 404))
async def retrieve_model(model: str, _: AuthDep, settings: SettingsDep) -> dict:
    """The served model's card; any other id is a 404, as OpenAI answers it."""
    check_model(settings, model)
    return _card(settings)
