"""schemathesis against the frontend's OpenAPI document: no 5xx and no hang on any request."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.frontend.conftest import Served


def test_no_server_error_and_no_hang(frontend: Served) -> None:
    schema = schemathesis.openapi.from_url(frontend.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/score",
        "/v1/models",
        "/v1/models/{model}",
        "/tokenize",
        "/detokenize",
        "/health/ready",
    }
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=25,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case) -> None:
            # Random model names only reach the 404; the served id lets bodies reach the engine.
            if isinstance(case.body, dict) and "model" in case.body:
                case.body["model"] = "toy-llm"
            # A hang fails through the timeout (generous: a loaded machine can take seconds
            # over a long generation); every request must get a non-5xx answer.
            response = case.call(base_url=frontend.url, timeout=60)
            assert response.status_code < 500, (case.as_curl_command(), response.text[:500])
            if response.status_code >= 400:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}

        run()
