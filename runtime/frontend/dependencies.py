"""FastAPI dependencies as ``Annotated`` aliases: state, settings, engine, API-key auth."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from runtime.frontend.engine import Engine
from runtime.frontend.errors import AuthenticationError, ModelNotFoundError
from runtime.frontend.settings import FrontendSettings
from runtime.frontend.state import FrontendState, hash_key

__all__ = ["AuthDep", "EngineDep", "SettingsDep", "StateDep", "check_model"]

_bearer = HTTPBearer(auto_error=False, description="An API key issued for this deployment.")


# Dependencies are async so FastAPI runs them inline, not in its thread pool (profiled cost).
async def _state(request: Request) -> FrontendState:
    return request.app.state.frontend


StateDep = Annotated[FrontendState, Depends(_state)]


async def _settings(state: StateDep) -> FrontendSettings:
    return state.settings


async def _engine(state: StateDep) -> Engine:
    return state.engine


SettingsDep = Annotated[FrontendSettings, Depends(_settings)]
EngineDep = Annotated[Engine, Depends(_engine)]


async def _authenticate(
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    if state.key_hashes is None:
        return
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise AuthenticationError("missing API key: send 'Authorization: Bearer <key>'")
    digest = hash_key(credentials.credentials)
    # Compare against every stored hash so timing does not reveal which one matched.
    matched = False
    for stored in state.key_hashes:
        matched |= hmac.compare_digest(digest, stored)
    if not matched:
        raise AuthenticationError("invalid API key", code="invalid_api_key")


AuthDep = Annotated[None, Depends(_authenticate)]


def check_model(settings: FrontendSettings, model: str) -> None:
    """Refuse a request for a model this frontend does not serve."""
    if model != settings.model_id:
        raise ModelNotFoundError(
            f"model '{model}' does not exist; this endpoint serves '{settings.model_id}'",
            param="model",
            code="model_not_found",
        )
