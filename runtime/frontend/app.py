"""``create_app(settings)``: the FastAPI application, its lifespan and its routers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from tokenizers import Tokenizer

from runtime.frontend.chat_template import ChatTemplate
from runtime.frontend.engine import Engine
from runtime.frontend.errors import install_error_handlers
from runtime.frontend.kserve_engine import KServeEngine
from runtime.frontend.middleware import AccessLogMiddleware, BodyLimitMiddleware
from runtime.frontend.routers import (
    chat,
    completions,
    embeddings,
    health,
    metrics,
    models,
    score,
    tokenize,
)
from runtime.frontend.settings import FrontendSettings
from runtime.frontend.state import FrontendState, Matryoshka, load_key_hashes

__all__ = ["create_app", "structured_outputs_key"]


def structured_outputs_key(settings: FrontendSettings) -> str:
    """The key the pinned Triton/vLLM pair reads structured outputs from."""
    if settings.structured_outputs_key is not None:
        return settings.structured_outputs_key
    from runtime.compat import load_matrix  # contract 3 (images/compat.toml)

    matrix = load_matrix()
    pair = (
        matrix.for_triton(settings.triton_release)
        if settings.triton_release is not None
        else matrix.default
    )
    return pair.structured_outputs_key


def _build_state(settings: FrontendSettings, engine: Engine) -> FrontendState:
    if settings.tokenizer_dir is None:
        raise ValueError(
            "LLM_SERVING_FRONTEND_TOKENIZER_DIR is not set: the frontend needs the model's "
            "tokenizer.json and tokenizer_config.json"
        )
    tokenizer_file = settings.tokenizer_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ValueError(f"LLM_SERVING_FRONTEND_TOKENIZER_DIR: {tokenizer_file} does not exist")
    model_config = settings.tokenizer_dir / "config.json"
    config: dict[str, object] = {}
    if model_config.is_file():
        try:
            config = json.loads(model_config.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"LLM_SERVING_FRONTEND_TOKENIZER_DIR: {model_config}: {exc}") from None
    embedding_size = settings.embedding_size or config.get("hidden_size")
    return FrontendState(
        settings=settings,
        engine=engine,
        template=ChatTemplate.from_tokenizer_dir(settings.tokenizer_dir),
        tokenizer=Tokenizer.from_file(str(tokenizer_file)),
        structured_key=structured_outputs_key(settings),
        key_hashes=load_key_hashes(settings.api_keys_file) if settings.api_keys_file else None,
        embedding_size=embedding_size if isinstance(embedding_size, int) else None,
        matryoshka=Matryoshka.from_model_config(config),
    )


def create_app(settings: FrontendSettings, engine: Engine | None = None) -> FastAPI:
    """The OpenAI-compatible app; ``engine`` defaults to KServe gRPC at ``settings.triton_url``."""
    backend = engine or KServeEngine(settings.triton_url, settings.model_name)
    # Built now so that configuration errors stop start-up with a message naming the variable.
    state = _build_state(settings, backend)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        app.state.frontend = state
        try:
            yield
        finally:
            await backend.close()

    app = FastAPI(
        title="llm-serving OpenAI-compatible frontend",
        version="1",
        description=(
            "Every request field is honoured, inert or refused: see docs/frontend-fields.md."
        ),
        lifespan=lifespan,
    )
    install_error_handlers(app)
    for router in (health, models, chat, completions, embeddings, score, tokenize, metrics):
        app.include_router(router.router)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_request_bytes)
    app.add_middleware(AccessLogMiddleware)
    return app
