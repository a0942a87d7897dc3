"""``POST /v1/embeddings``: one backend ``embedding_request`` per input string."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from runtime.frontend.dependencies import AuthDep, StateDep, check_model
from runtime.frontend.errors import FieldRefusedError
from runtime.frontend.fields import check_fields
from runtime.frontend.schemas import EmbeddingRequest
from runtime.frontend.streaming import run_until_disconnect

__all__ = ["ROUTE", "router"]

ROUTE = "/v1/embeddings"
router = APIRouter(tags=["embeddings"])


@router.post(ROUTE)
async def create_embeddings(
    body: EmbeddingRequest, request: Request, _: AuthDep, state: StateDep
) -> Any:
    """Embed each input; ``encoding_format=base64`` packs little-endian float32."""
    check_fields(ROUTE, body)
    check_model(state, body.model)
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    if body.dimensions is not None:
        size = state.embedding_size
        if size is None:
            raise FieldRefusedError(
                "dimensions",
                "the model's embedding size is unknown (no hidden_size in config.json, "
                "LLM_SERVING_FRONTEND_EMBEDDING_SIZE unset)",
            )
        if body.dimensions > size:
            raise FieldRefusedError(
                "dimensions", f"the model's embeddings have {size} dimensions; send at most that"
            )
        matryoshka = state.matryoshka
        if not matryoshka.supported:
            raise FieldRefusedError(
                "dimensions",
                "the model's embeddings cannot be shortened (its config.json declares neither "
                "is_matryoshka nor matryoshka_dimensions); omit dimensions",
            )
        if matryoshka.dimensions is not None and body.dimensions not in matryoshka.dimensions:
            raise FieldRefusedError(
                "dimensions",
                f"the model's embeddings shorten to {list(matryoshka.dimensions)} only",
            )

    async def run_all():
        return await asyncio.gather(*(state.engine.embed(t, body.dimensions) for t in texts))

    results = await run_until_disconnect(request, run_all(), state.settings.request_timeout_s)
    data = []
    for i, (vector, _tokens) in enumerate(results):
        encoded: Any = vector
        if body.encoding_format == "base64":
            encoded = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
        data.append({"object": "embedding", "index": i, "embedding": encoded})
    tokens = sum(t for _, t in results)
    # A Response skips FastAPI's jsonable_encoder pass over the dict (per-request cost).
    return JSONResponse(
        {
            "object": "list",
            "model": body.model,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )
