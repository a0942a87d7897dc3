"""Typed frontend errors and the one handler that turns them into OpenAI error bodies."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = [
    "AuthenticationError",
    "BackendError",
    "BackendUnavailableError",
    "ClientDisconnectedError",
    "DeadlineExceededError",
    "EngineFailedError",
    "ErrorDetail",
    "ErrorResponse",
    "FieldRefusedError",
    "FrontendError",
    "IncompleteOutputError",
    "InvalidOutputError",
    "InvalidRequestError",
    "ModelNotFoundError",
    "NotSupportedError",
    "RateLimitError",
    "RequestTooLargeError",
    "TruncatedOutputError",
    "error_body",
    "error_responses",
    "install_error_handlers",
    "internal_error",
]

LOGGER = "runtime.frontend"


class FrontendError(Exception):
    """Base of every error the frontend returns; subclasses fix the status and the type."""

    status_code = 500
    error_type = "server_error"
    #: Seconds a client should wait before retrying (the ``Retry-After`` header), if it should.
    retry_after_s: int | None = None
    #: False where a retry cannot help (``x-should-retry: false``, which the OpenAI SDKs obey:
    #: they retry every 5xx otherwise).
    retryable: bool = True

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequestError(FrontendError):
    """A request field has a value the frontend cannot accept."""

    status_code = 400
    error_type = "invalid_request_error"


class FieldRefusedError(InvalidRequestError):
    """A field is refused by the field table (or is not in it)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(
            f"field '{field}' is refused: {reason}", param=field, code="unsupported_field"
        )


class NotSupportedError(FrontendError):
    """The deployed backend cannot perform the requested operation at all."""

    status_code = 501
    error_type = "invalid_request_error"
    retryable = False


class ModelNotFoundError(FrontendError):
    status_code = 404
    error_type = "invalid_request_error"


class AuthenticationError(FrontendError):
    status_code = 401
    error_type = "authentication_error"


class RateLimitError(FrontendError):
    status_code = 429
    error_type = "rate_limit_error"
    # Open streams end within seconds; SDKs wait this long instead of guessing.
    retry_after_s = 1


class RequestTooLargeError(FrontendError):
    status_code = 413
    error_type = "invalid_request_error"


class DeadlineExceededError(FrontendError):
    status_code = 504
    error_type = "timeout_error"
    # The request already ran for the whole deadline: a retry would triple the client's wait.
    retryable = False


class ClientDisconnectedError(FrontendError):
    """The client went away before its response was ready; nobody reads the 499 it gets."""

    # nginx's "client closed request": the access log tells these from the server's failures.
    status_code = 499
    error_type = "client_closed_request"


class BackendError(FrontendError):
    """Triton answered with an error for this request."""

    status_code = 502
    error_type = "server_error"


class EngineFailedError(BackendError):
    """The engine ended the request with vLLM's finish_reason ``error``, mostly a grammar that
    does not compile: the same request would fail again."""

    retryable = False


class BackendUnavailableError(FrontendError):
    status_code = 503
    error_type = "server_error"
    # Triton restarting or its channel reconnecting: worth a retry once it is back.
    retry_after_s = 1


class InvalidOutputError(FrontendError):
    """The engine produced output that violates the requested format (e.g. invalid JSON)."""

    status_code = 502
    error_type = "server_error"


class IncompleteOutputError(InvalidOutputError):
    """Output that ended before the requested format was complete (JSON that does not parse,
    part of a choice): the engine's fault, unless the client's stop sequence ended it."""


class TruncatedOutputError(InvalidRequestError):
    """Output cut short by the client's max_tokens or stop sequences broke the requested format
    (counted too)."""


class ErrorDetail(BaseModel):
    """What went wrong, in OpenAI's terms."""

    message: str = Field(description="What went wrong, and what to send instead.")
    type: str = Field(description="The error class, e.g. invalid_request_error, server_error.")
    param: str | None = Field(description="The request field at fault, if one is.")
    code: str | None = Field(description="A machine-readable reason, e.g. model_not_found.")


class ErrorResponse(BaseModel):
    """OpenAI's error body: the body of every error this frontend answers."""

    error: ErrorDetail


def error_body(exc: FrontendError) -> dict:
    """The OpenAI error body ``{"error": {"message", "type", "param", "code"}}``."""
    detail = ErrorDetail(message=exc.message, type=exc.error_type, param=exc.param, code=exc.code)
    return ErrorResponse(error=detail).model_dump()


#: The 501 of a route the served model's task cannot answer.
NOT_GENERATING = "The model is a pooling model: it serves /v1/embeddings only"
NOT_POOLING = "The model is not a pooling model: it generates, and serves no embeddings"

# What each documented status means, and the errors that answer it (their headers).
_STATUSES: dict[int, tuple[str, tuple[type[FrontendError], ...]]] = {
    400: (
        "Invalid request: a refused field or value (param names it), or a body that is not JSON",
        (InvalidRequestError,),
    ),
    401: (
        "Missing or invalid API key (when LLM_SERVING_FRONTEND_API_KEYS_FILE is set)",
        (AuthenticationError,),
    ),
    404: ("The model is not the one this endpoint serves", (ModelNotFoundError,)),
    413: ("The body exceeds LLM_SERVING_FRONTEND_MAX_REQUEST_BYTES", (RequestTooLargeError,)),
    429: ("Too many open streams; retry after Retry-After seconds", (RateLimitError,)),
    501: ("The deployed backend cannot perform this operation", (NotSupportedError,)),
    502: (
        "Triton answered with an error, or the model's output broke the requested format",
        (BackendError, InvalidOutputError),
    ),
    503: ("Triton is unreachable; retry after Retry-After seconds", (BackendUnavailableError,)),
    504: (
        "The request deadline (LLM_SERVING_FRONTEND_REQUEST_TIMEOUT_S) passed",
        (DeadlineExceededError,),
    ),
}


def _headers(errors: tuple[type[FrontendError], ...]) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if any(e.retry_after_s is not None for e in errors):
        headers["Retry-After"] = {
            "description": "Seconds to wait before a retry.",
            "schema": {"type": "integer"},
        }
    if any(not e.retryable for e in errors):
        headers["x-should-retry"] = {
            "description": "false: a retry cannot help (the OpenAI SDKs obey it).",
            "schema": {"type": "string", "enum": ["false"]},
        }
    return headers


def error_responses(
    *statuses: int, descriptions: Mapping[int, str] | None = None
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` for a route that answers ``statuses`` with :class:`ErrorResponse`.

    ``"default"`` documents every other error (a 500 from a bug, a 405) with the same body.
    FastAPI documents its own 422 only on routes that declare none of 422, "4XX" and
    "default", so this also keeps that status, which the frontend never answers (validation
    errors are 400s), out of the document. ``descriptions`` replace the generic ones.
    """
    described = descriptions or {}
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        description, errors = _STATUSES[status]
        response: dict[str, Any] = {
            "model": ErrorResponse,
            "description": described.get(status, description),
        }
        headers = _headers(errors)
        if headers:
            response["headers"] = headers
        responses[status] = response
    responses["default"] = {
        "model": ErrorResponse,
        "description": "Any other error (a 500 is a bug in the frontend), with the same body",
    }
    return responses


def internal_error(exc: BaseException) -> FrontendError:
    """Log an unexpected exception with its traceback; the client gets a body without it."""
    logging.getLogger(LOGGER).error("unexpected error: %r", exc, exc_info=exc)
    return FrontendError(
        "internal error in the frontend (its log has the traceback)", code="internal_error"
    )


def _validation_error(exc: RequestValidationError) -> FrontendError:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid body", "type": ""}
    if first.get("type") == "json_invalid":
        # FastAPI puts the decoder's character offset where a field name would be.
        loc = first.get("loc", ())
        at = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
        ctx = first.get("ctx")
        reason = (ctx.get("error") if isinstance(ctx, dict) else None) or "JSON decode error"
        return InvalidRequestError(f"request body is not valid JSON ({reason}{at})", param=None)
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    field = ".".join(loc) or "body"
    if first.get("type") == "extra_forbidden":
        return FieldRefusedError(field, "not in this route's field table (unknown field)")
    return InvalidRequestError(f"field '{field}': {first.get('msg')}", param=field)


def install_error_handlers(app: FastAPI) -> None:
    """Map typed errors, validation errors, HTTP errors and bugs to the OpenAI error body."""

    async def on_frontend(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, FrontendError)
        headers = {}
        if exc.retry_after_s is not None:
            headers["Retry-After"] = str(exc.retry_after_s)
        if not exc.retryable:
            headers["x-should-retry"] = "false"
        return JSONResponse(error_body(exc), status_code=exc.status_code, headers=headers)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        err = _validation_error(exc)
        return JSONResponse(error_body(err), status_code=err.status_code)

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        err = FrontendError(str(exc.detail))
        err.status_code = exc.status_code
        err.error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(error_body(err), status_code=exc.status_code, headers=exc.headers)

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        # A bug, not a bad request: an OpenAI body still, so clients parse it as an error.
        return JSONResponse(error_body(internal_error(exc)), status_code=500)

    app.add_exception_handler(FrontendError, on_frontend)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
