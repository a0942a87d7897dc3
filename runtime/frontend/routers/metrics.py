"""``GET /metrics``: the frontend's own counters (in the pod the metrics proxy also merges them)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from runtime.frontend.dependencies import AuthDep, StateDep
from runtime.frontend.errors import error_responses

__all__ = ["router"]

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, responses=error_responses(401))
async def metrics(_: AuthDep, state: StateDep) -> Response:
    """Prometheus text exposition of the frontend's registry."""
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
