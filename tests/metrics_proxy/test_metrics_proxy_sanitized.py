"""The native merge's tests, the property tests against the Python path among them, run against
an AddressSanitizer + UndefinedBehaviorSanitizer build of ``_metrics``
(``tests/support/sanitized.py``), together with the tests of the native server and Triton
client (the app, HTTP and client tests)."""

from __future__ import annotations

import pytest

from tests.support.sanitized import build_sanitized, run_tests_against

TESTS = [
    "tests/metrics_proxy/test_metrics_proxy_native.py",
    "tests/metrics_proxy/test_metrics_proxy_app.py",
    "tests/metrics_proxy/test_metrics_proxy_http.py",
    "tests/metrics_proxy/test_metrics_proxy_triton_client.py",
]


@pytest.mark.sanitize
@pytest.mark.timeout(900)
def test_native_merge_tests_pass_under_asan_and_ubsan() -> None:
    module = build_sanitized("_metrics", "csrc/metrics/_metrics*.so")
    run_tests_against("runtime.metrics_proxy._metrics", module, TESTS)
