"""Every choice of an ``n > 1`` request in each vLLM output the stock backend responds with.

vLLM V1 runs ``n`` choices as child requests and emits a ``RequestOutput`` whenever some of them
advance, holding only those (each ``CompletionOutput`` names its choice by ``index``), until the
last one finishes. The stock backend reads ``outputs`` by position: streamed, choice 1's text is
diffed against choice 0's; not streamed, it answers with the last output only, which lacks every
choice that finished earlier. `ChoiceMerger` keeps the latest output of each choice, so each
output handed on holds all ``n`` in order (an empty one for a choice not yet started).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

__all__ = ["ChoiceMerger"]


class ChoiceMerger:
    """Merges the outputs of one request with ``n`` choices, in order of arrival."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._latest: dict[int, Any] = {}

    def merge(self, request_output: Any) -> Any:
        """``request_output`` with ``outputs`` holding every choice's latest (cumulative) output."""
        if self.n <= 1:
            return request_output
        for output in request_output.outputs:
            self._latest[output.index] = output
        template = request_output.outputs[0] if request_output.outputs else None
        merged = []
        for index in range(self.n):
            output = self._latest.get(index)
            if output is None and template is not None:
                output = dataclasses.replace(
                    template,
                    index=index,
                    text="",
                    token_ids=[],
                    cumulative_logprob=None,
                    logprobs=None,
                    finish_reason=None,
                    stop_reason=None,
                )
            if output is not None:
                merged.append(output)
        result = copy.copy(request_output)
        result.outputs = merged
        return result
