"""What the app holds for its lifetime (``app.state.frontend``), built in the lifespan."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter
from tokenizers import Tokenizer

from runtime.frontend.chat_template import ChatTemplate, tokenizer_adds_bos
from runtime.frontend.engine import Engine
from runtime.frontend.settings import FrontendSettings
from runtime.frontend.token_names import TokenNames

__all__ = ["FrontendMetrics", "FrontendState", "Matryoshka", "hash_key", "load_key_hashes"]


def hash_key(key: str) -> str:
    """The stored form of an API key (SHA-256, hex)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def load_key_hashes(path: Path) -> tuple[str, ...]:
    """Read SHA-256 hex digests, one per line (``#`` comments allowed), from a file or mount."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"LLM_SERVING_FRONTEND_API_KEYS_FILE: cannot read {path}: {exc}") from None
    hashes = tuple(
        line.strip().lower() for line in lines if line.strip() and not line.startswith("#")
    )
    for digest in hashes:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(
                f"LLM_SERVING_FRONTEND_API_KEYS_FILE: {path} holds a line that is not a SHA-256 "
                "hex digest; store hashes (sha256sum), never keys"
            )
    if not hashes:
        raise ValueError(f"LLM_SERVING_FRONTEND_API_KEYS_FILE: {path} holds no key hashes")
    return hashes


@dataclass
class FrontendMetrics:
    """Counters the frontend exports (in its own registry; multiprocess mode writes files)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    invalid_output: Counter = field(init=False)

    def __post_init__(self) -> None:
        self.invalid_output = Counter(
            "llm_serving_frontend_invalid_output",
            "Responses withheld because the engine's output broke the requested format.",
            ["model", "route"],
            registry=self.registry,
        )


@dataclass(frozen=True)
class Matryoshka:
    """Whether the model's embeddings may be truncated (``dimensions``), and to which sizes.

    Read from the model's ``config.json`` as vLLM reads it: ``matryoshka_dimensions`` (any
    size in the list) or ``is_matryoshka`` (any size); vLLM refuses ``dimensions`` otherwise.
    """

    supported: bool = False
    dimensions: tuple[int, ...] | None = None

    @classmethod
    def from_model_config(cls, config: dict[str, object]) -> Matryoshka:
        listed = config.get("matryoshka_dimensions")
        if isinstance(listed, list) and listed:
            return cls(True, tuple(int(d) for d in listed))
        return cls(bool(config.get("is_matryoshka")))


@dataclass
class FrontendState:
    settings: FrontendSettings
    engine: Engine
    template: ChatTemplate
    tokenizer: Tokenizer
    structured_key: str
    key_hashes: tuple[str, ...] | None
    embedding_size: int | None
    matryoshka: Matryoshka = field(default_factory=Matryoshka)
    metrics: FrontendMetrics = field(default_factory=FrontendMetrics)
    open_streams: int = 0
    #: Tasks closing a departed request's backend streams, held until done (asyncio keeps
    #: only weak references to tasks).
    closing_tasks: set[asyncio.Future[None]] = field(default_factory=set)
    #: Whether the tokenizer adds the template's bos_token itself; chat prompts then drop the
    #: template's, or the engine would run on two.
    adds_bos: bool = field(init=False)
    token_names: TokenNames = field(init=False)

    def __post_init__(self) -> None:
        self.adds_bos = tokenizer_adds_bos(self.tokenizer, self.template.bos_token)
        self.token_names = TokenNames.from_tokenizer(self.tokenizer)

    def prompt_ids(self, text: str) -> list[int]:
        """The tokens the backend will count: it tokenizes text_input with special tokens added."""
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def prompt_tokens(self, text: str) -> int:
        """How many tokens the backend will count (:meth:`prompt_ids`)."""
        return len(self.prompt_ids(text))
