"""``RequestOutput.prompt_logprobs`` as the JSON string the ``prompt_logprobs`` output carries.

The shape is the one the stock backend already uses for its per-token ``logprobs`` output, one
entry per prompt position: ``null`` where vLLM has none (the first token), else an object
mapping each token id (a string, as JSON keys are) to ``{"logprob", "rank",
"decoded_token"}``. With ``prompt_logprobs: 0`` each object holds just the prompt's own token,
which is what the frontend's scoring reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # vLLM's classes; only their attributes are read here
    from vllm.logprobs import Logprob

__all__ = ["encode_prompt_logprobs"]


def encode_prompt_logprobs(positions: Iterable[Mapping[int, Logprob] | None]) -> bytes:
    """UTF-8 JSON of vLLM's prompt logprobs (a ``list`` or vLLM's ``FlatLogprobs``).

    Iterating a ``FlatLogprobs`` builds each position's ``{token_id: Logprob}`` on the fly,
    so both containers go through the same loop; nothing is kept after the call.
    """
    rows: list[dict[str, dict[str, Any]] | None] = []
    for position in positions:
        if not position:  # None in a list, {} from FlatLogprobs: no entry at this position
            rows.append(None)
            continue
        rows.append(
            {
                str(token_id): {
                    "logprob": float(entry.logprob),
                    "rank": entry.rank,
                    "decoded_token": entry.decoded_token,
                }
                for token_id, entry in position.items()
            }
        )
    # A -inf logprob (a token the model rules out) is legal in vLLM; JSON has no -inf, so it
    # goes out as the same -Infinity token the stock backend's json.dumps writes.
    return json.dumps(rows).encode("utf-8")
