"""``POST /v1/score``: log-probabilities of candidate continuations, prefill only."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from runtime.frontend.dependencies import AuthDep, StateDep, check_model
from runtime.frontend.errors import InvalidRequestError, error_responses
from runtime.frontend.fields import check_fields
from runtime.frontend.sampling import resolve_max_tokens
from runtime.frontend.schemas import ScoreRequest
from runtime.frontend.streaming import run_until_disconnect

__all__ = ["ROUTE", "router"]

ROUTE = "/v1/score"
router = APIRouter(tags=["score"])


@router.post(
    ROUTE,
    responses=error_responses(
        *(400, 401, 404, 413, 501, 502, 503, 504),
        descriptions={501: "backend returns no prompt logprobs"},
    ),
)
async def score(body: ScoreRequest, request: Request, _: AuthDep, state: StateDep) -> Any:
    """Rank candidates by log p(candidate | prompt); no token is decoded for the result."""
    check_fields(ROUTE, body)
    check_model(state.settings, body.model)
    prompt_ids = state.tokenizer.encode(body.prompt, add_special_tokens=True).ids
    for i, candidate in enumerate(body.candidates):
        ids = state.tokenizer.encode(body.prompt + candidate, add_special_tokens=True).ids
        # The score sums the candidate's own tokens, so the prompt must tokenize the same
        # with and without it, and the candidate must add at least one token.
        if len(ids) <= len(prompt_ids) or ids[: len(prompt_ids)] != prompt_ids:
            raise InvalidRequestError(
                f"candidates[{i}] does not start at a token boundary of the prompt or adds no "
                "token; start it with the separator (e.g. a space)",
                param=f"candidates[{i}]",
            )
        # Each prefill also samples one token (vLLM's minimum), which needs room in the context.
        resolve_max_tokens(
            1,
            state.prompt_tokens(body.prompt + candidate),
            state.settings.max_model_len,
            "candidates",
            prompt_field=f"candidates[{i}]",
        )
    scored = await run_until_disconnect(
        request,
        state.engine.score(body.prompt, body.candidates),
        state.settings.request_timeout_s,
    )
    # A Response skips FastAPI's jsonable_encoder pass over the dict (per-request cost).
    return JSONResponse(
        {
            "object": "list",
            "model": body.model,
            "data": [
                {
                    "object": "score",
                    "index": i,
                    "candidate": candidate,
                    "logprob": s.logprob,
                    "num_tokens": s.num_tokens,
                    "token_logprobs": list(s.token_logprobs),
                }
                for i, (candidate, s) in enumerate(zip(body.candidates, scored, strict=True))
            ],
            "usage": {"prompt_tokens": sum(s.num_tokens for s in scored)},
        }
    )
