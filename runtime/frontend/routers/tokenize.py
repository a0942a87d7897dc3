"""``POST /tokenize`` and ``POST /detokenize``, vLLM's routes: the served model's tokenizer,
counting what the engine would see for a prompt or a conversation."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from runtime.frontend.dependencies import AuthDep, StateDep, check_model
from runtime.frontend.errors import InvalidRequestError, error_responses
from runtime.frontend.fields import check_fields
from runtime.frontend.routers.chat import render_prompt
from runtime.frontend.schemas import DetokenizeRequest, TokenizeRequest
from runtime.frontend.token_prompts import check_token_ids
from runtime.frontend.tools import plan_tools

__all__ = ["DETOKENIZE", "TOKENIZE", "router"]

TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
router = APIRouter(tags=["tokenize"])
_CHAT_ONLY = (
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "tools",
)


@router.post(TOKENIZE, responses=error_responses(400, 401, 404, 413))
async def tokenize(body: TokenizeRequest, _: AuthDep, state: StateDep) -> dict[str, Any]:
    """The token ids of ``prompt`` as text completions count it, or of ``messages`` as chat
    completions render and count them."""
    check_fields(TOKENIZE, body)
    check_model(state.settings, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise InvalidRequestError("send either prompt or messages", param="prompt")
    if body.messages is None:
        for name in _CHAT_ONLY:
            if getattr(body, name) is not None:
                raise InvalidRequestError(
                    f"{name} applies to messages only; send messages, or leave it out", param=name
                )
        add_special = body.add_special_tokens is not False
        ids = state.tokenizer.encode(body.prompt or "", add_special_tokens=add_special).ids
    else:
        if body.add_special_tokens is not None:
            raise InvalidRequestError(
                "add_special_tokens applies to prompt only: messages count as chat completions "
                "send them to the engine; leave it out",
                param="add_special_tokens",
            )
        plan = plan_tools(body.tools, None, state.settings.tool_call_parser)
        ids = state.prompt_ids(render_prompt(state, body, plan.template_tools))
    strs = [state.tokenizer.id_to_token(i) for i in ids] if body.return_token_strs else None
    return {
        "count": len(ids),
        "max_model_len": state.settings.max_model_len,
        "tokens": ids,
        "token_strs": strs,
    }


@router.post(DETOKENIZE, responses=error_responses(400, 401, 404, 413))
async def detokenize(body: DetokenizeRequest, _: AuthDep, state: StateDep) -> dict[str, str]:
    """The text of ``tokens``, special tokens written out."""
    check_fields(DETOKENIZE, body)
    check_model(state.settings, body.model)
    check_token_ids(state.tokenizer.get_vocab_size(), body.tokens, "tokens", "tokens")
    return {"prompt": state.tokenizer.decode(body.tokens, skip_special_tokens=False)}
