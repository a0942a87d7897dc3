"""The engine interface the routes use, and the value types that cross it."""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ChoiceOutput",
    "Engine",
    "EngineOutput",
    "GenerateParams",
    "ScoredCandidate",
    "TokenLogprob",
]


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token as the backend decoded it, its log-probability, the most likely
    alternatives (best first), and its id and rank where the backend gives them."""

    token: str
    logprob: float
    top: tuple[TokenLogprob, ...] = ()
    token_id: int | None = None
    rank: int | None = None


@dataclass(frozen=True)
class GenerateParams:
    """One generation: the prompt text, the backend's ``sampling_parameters`` and flags, and
    the prefix cache's ``cache_salt``."""

    prompt: str
    sampling: dict[str, Any]
    stream: bool
    logprobs: bool
    request_id: str
    cache_salt: str | None = None


@dataclass(frozen=True)
class ChoiceOutput:
    """New text of one choice since the previous output; ``finish_reason`` once it ends, with
    vLLM's ``stop_reason`` (the stop string or token id that ended it) where the backend says."""

    index: int
    text: str
    finish_reason: str | None
    num_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()
    stop_reason: str | int | None = None


@dataclass(frozen=True)
class EngineOutput:
    """New outputs of every choice; the prompt's token count and, when the sampling
    parameters ask for ``prompt_logprobs``, each prompt position's (the first has none);
    on the last, where the backend counts them, the prompt tokens its prefix cache served."""

    choices: tuple[ChoiceOutput, ...]
    prompt_tokens: int | None = None
    finished: bool = False
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    cached_tokens: int | None = None


@dataclass(frozen=True)
class ScoredCandidate:
    logprob: float
    num_tokens: int
    token_logprobs: tuple[float, ...] = field(default=())


class Engine(abc.ABC):
    """What the routes need from an inference backend (Triton over gRPC, or in-process)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect and read the model's capabilities."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def ready(self) -> bool:
        """True once the server and the model are ready for requests."""

    @abc.abstractmethod
    def generate(self, params: GenerateParams) -> AsyncGenerator[EngineOutput, None]:
        """Outputs until every choice has finished; closing the iterator cancels the request."""

    @abc.abstractmethod
    async def embed(self, text: str, dimensions: int | None) -> tuple[list[float], int]:
        """The embedding of one input and its token count."""

    @abc.abstractmethod
    async def score(self, prompt: str, candidates: list[str]) -> list[ScoredCandidate]:
        """Log-probability of each candidate continuing ``prompt``, from prefill only."""

    async def returns_prompt_logprobs(self) -> str | None:
        """``None`` when :meth:`generate` returns ``prompt_logprobs`` if asked; otherwise why
        not, for the client."""
        return "this engine returns no prompt log-probabilities"
