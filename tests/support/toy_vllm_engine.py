"""A stand-in for vLLM's ``AsyncLLM.generate``, built on the toy model and vLLM's real output
classes (``vllm.outputs.RequestOutput``/``CompletionOutput``, ``vllm.logprobs.Logprob``).

The real engine runs under real Triton in ``tests/runtime/test_pod_real_triton.py``; the
backend's unit tests use this for outputs they choose (exact texts and log-probabilities, every
shape of streamed and final output) without a minute's engine start. They get real
``RequestOutput`` objects whose text and (prompt) log-probabilities come from
:class:`tests.support.toy_model.ToyModel`, the model the KServe stand-in serves. Outputs are
cumulative, as vLLM's default ``RequestOutputKind.CUMULATIVE``: every one repeats the prompt
log-probabilities, and the prompt tokens a :class:`~tests.support.toy_model.ToyPrefixCache`
served, keyed by the prompt's ``cache_salt``. It never runs in product code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from vllm.logprobs import FlatLogprobs, Logprob, create_prompt_logprobs
from vllm.outputs import CompletionOutput, RequestOutput

from tests.support.toy_model import VOCAB, ToyModel, ToyPrefixCache

__all__ = ["ToyEngine", "prompt_logprobs_of"]


def prompt_logprobs_of(
    toy: ToyModel, prompt: str, *, flat: bool = False
) -> list[dict[int, Logprob] | None] | FlatLogprobs:
    """vLLM's ``prompt_logprobs`` (``prompt_logprobs=0``: each prompt token's own entry)."""
    # vLLM's own container starts with the first token's position (no logprob), as the toy's.
    positions = create_prompt_logprobs(flat)
    for row in toy.prompt_logprobs(prompt)[1:]:
        assert row is not None  # only the first position has none
        positions.append(
            {tid: Logprob(logprob=lp, rank=1, decoded_token=VOCAB[tid]) for tid, lp in row.items()}
        )
    return positions


class ToyEngine:
    """``generate(prompt, sampling_params, request_id, lora_request=None)`` like vLLM's."""

    def __init__(self, toy: ToyModel | None = None) -> None:
        self.toy = toy or ToyModel()
        self.prefix_cache = ToyPrefixCache()

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, lora_request: Any = None
    ) -> AsyncIterator[RequestOutput]:
        text = prompt["prompt"] if isinstance(prompt, dict) else prompt
        salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
        cached = self.prefix_cache.lookup(self.toy.tokenize(text), salt)
        params = {
            "max_tokens": sampling_params.max_tokens,
            "temperature": sampling_params.temperature,
            "n": sampling_params.n,
            "stop": sampling_params.stop,
            "stop_token_ids": sampling_params.stop_token_ids,
        }
        wanted = sampling_params.prompt_logprobs is not None
        plp = prompt_logprobs_of(self.toy, text) if wanted else None
        for choices in self.toy.generate(text, params):
            yield RequestOutput(
                request_id=request_id,
                prompt=text,
                prompt_token_ids=self.toy.tokenize(text),
                prompt_logprobs=plp,
                outputs=[
                    CompletionOutput(
                        index=i,
                        text=c.text,
                        token_ids=[s.token_id for s in c.steps],
                        cumulative_logprob=c.cumulative_logprob,
                        logprobs=None,
                        finish_reason=c.finish_reason,
                        stop_reason=c.stop_reason,
                    )
                    for i, c in enumerate(choices)
                ],
                finished=all(c.finish_reason is not None for c in choices),
                num_cached_tokens=cached,
            )
