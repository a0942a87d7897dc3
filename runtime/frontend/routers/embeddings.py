"""``POST /v1/embeddings``: one backend ``embedding_request`` per input string."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from runtime.frontend.dependencies import AuthDep, StateDep, check_model
from runtime.frontend.errors import (
    NOT_POOLING,
    FieldRefusedError,
    InvalidRequestError,
    error_responses,
)
from runtime.frontend.fields import check_fields
from runtime.frontend.schemas import EmbeddingRequest
from runtime.frontend.state import FrontendState
from runtime.frontend.streaming import gather_or_cancel, run_until_disconnect
from runtime.frontend.token_prompts import prompt_texts

__all__ = ["ROUTE", "router"]

ROUTE = "/v1/embeddings"
router = APIRouter(tags=["embeddings"])
_HEAD_CHARS = 64


def _no_tokens(state: FrontendState, text: str) -> bool:
    """Whether ``text`` tokenizes to nothing, which vLLM refuses ("The decoder prompt cannot
    be empty"); "" that gets special tokens (BERT's [CLS] [SEP]) is embedded, as in vLLM."""
    # Tokenizing a 4 MiB batch whole would hold the event loop for about a second; a head
    # that has tokens shows the text has them, so only texts that may be empty are.
    return state.prompt_tokens(text[:_HEAD_CHARS]) == 0 and state.prompt_tokens(text) == 0


@router.post(
    ROUTE,
    responses=error_responses(
        *(400, 401, 404, 413, 501, 502, 503, 504), descriptions={501: NOT_POOLING}
    ),
)
async def create_embeddings(
    body: EmbeddingRequest, request: Request, _: AuthDep, state: StateDep
) -> Any:
    """Embed each input; ``encoding_format=base64`` packs little-endian float32."""
    check_fields(ROUTE, body)
    check_model(state.settings, body.model)
    texts = prompt_texts(state, body.input, "input")
    for i, text in enumerate(texts):
        if _no_tokens(state, text):
            name = "input" if isinstance(body.input, str) else f"input[{i}]"
            raise InvalidRequestError(
                f"{name} is empty: it has no tokens for the model; send some text",
                param="input",
            )
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

    results = await run_until_disconnect(
        request,
        gather_or_cancel(state.engine.embed(t, body.dimensions) for t in texts),
        state.settings.request_timeout_s,
    )
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
