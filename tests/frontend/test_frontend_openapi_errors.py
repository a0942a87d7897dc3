"""The OpenAPI document tells the truth about errors: no FastAPI 422, the OpenAI error body on
every error status, and the status a bad request really gets is one the route documents."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from tests.frontend.conftest import Served

MODEL = "toy-llm"
# A valid body per POST route; each case below breaks one of them.
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": MODEL, "prompt": "hi"},
    "/v1/embeddings": {"model": MODEL, "input": "hi"},
    "/v1/score": {"model": MODEL, "prompt": "hi", "candidates": [" there"]},
    "/tokenize": {"model": MODEL, "prompt": "hi"},
    "/detokenize": {"model": MODEL, "tokens": [1]},
}
# (case, how to break the body, the status the frontend answers).
CASES = [
    ("not JSON", lambda body: b'{"model": ', 400),
    ("not an object", lambda body: b"[]", 400),
    ("unknown field", lambda body: {**body, "frobnicate": 1}, 400),
    ("missing field", lambda body: {k: v for k, v in body.items() if k != "model"}, 400),
    ("wrong type", lambda body: {**body, "model": ["a", "list"]}, 400),
    ("unknown model", lambda body: {**body, "model": "no-such-model"}, 404),
]
ERROR_REF = "#/components/schemas/ErrorResponse"


@pytest.fixture(scope="module")
def document(frontend: Served) -> dict[str, Any]:
    response = httpx.get(frontend.url + "/openapi.json", timeout=30)
    response.raise_for_status()
    return response.json()


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ]


def _error_schema(document: dict[str, Any], path: str, status: int) -> Draft202012Validator:
    """A validator for the body ``path`` documents for ``status`` (its ``$ref`` resolved)."""
    responses = document["paths"][path]["post"]["responses"]
    assert str(status) in responses, f"POST {path} answers {status}, which it does not document"
    schema = responses[str(status)]["content"]["application/json"]["schema"]
    return Draft202012Validator({**schema, "components": document["components"]})


def test_no_fastapi_validation_error_documented(document: dict[str, Any]) -> None:
    for method, path, operation in _operations(document):
        assert "422" not in operation["responses"], f"{method} {path} documents a 422"
    assert "HTTPValidationError" not in json.dumps(document)
    assert "ValidationError" not in document["components"]["schemas"]


def test_post_routes_document_400_with_the_error_body(document: dict[str, Any]) -> None:
    posts = [(path, op) for method, path, op in _operations(document) if method == "POST"]
    assert {path for path, _ in posts} == set(VALID)
    for path, operation in posts:
        response = operation["responses"].get("400")
        assert response is not None, f"POST {path} documents no 400"
        assert response["content"]["application/json"]["schema"] == {"$ref": ERROR_REF}


def test_every_documented_error_has_the_error_body(document: dict[str, Any]) -> None:
    for method, path, operation in _operations(document):
        for status, response in operation["responses"].items():
            if status.startswith("2") or (path, status) == ("/health/ready", "503"):
                continue  # the probe's 503 is its answer, {"status": "not ready"}
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": ERROR_REF}, (method, path, status)
    detail = document["components"]["schemas"]["ErrorDetail"]
    assert set(detail["required"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path", sorted(VALID))
@pytest.mark.parametrize(("case", "broken", "status"), CASES, ids=[c[0] for c in CASES])
def test_bad_request_status_and_body_are_documented(
    frontend: Served, document: dict[str, Any], path: str, case: str, broken, status: int
) -> None:
    body = broken(VALID[path])
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(
        frontend.url + path,
        content=content,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == status, (case, response.text)
    errors = sorted(_error_schema(document, path, status).iter_errors(response.json()), key=str)
    assert not errors, (case, response.json(), [e.message for e in errors])


@pytest.mark.parametrize("path", sorted(VALID))
def test_body_over_the_limit_is_a_documented_413(
    frontend: Served, document: dict[str, Any], path: str
) -> None:
    limit = frontend.state.settings.max_request_bytes
    response = httpx.post(
        frontend.url + path,
        content=b" " * (limit + 1),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413, response.text
    assert not list(_error_schema(document, path, 413).iter_errors(response.json()))
