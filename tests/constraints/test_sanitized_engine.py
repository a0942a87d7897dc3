"""The engine tests rerun against an AddressSanitizer + UndefinedBehaviorSanitizer build of the
constraint engine (``tests/support/sanitized.py``): engine, property and error tests."""

from __future__ import annotations

import pytest

from tests.support.sanitized import build_sanitized, run_tests_against

TESTS = [
    "tests/constraints/test_engine_behaviour.py",
    "tests/constraints/test_processor_properties.py",
    "tests/constraints/test_runner_v2_properties.py",
    "tests/constraints/test_config_errors.py",
    "tests/constraints/test_decoded_properties.py",
    "tests/constraints/test_engine_threads.py",
    "tests/constraints/test_engine_step_refusals.py",
]


@pytest.mark.sanitize
@pytest.mark.timeout(900)
def test_engine_tests_pass_under_asan_and_ubsan() -> None:
    module = build_sanitized("_engine", "csrc/_engine*.so")
    run_tests_against("runtime.constraints._engine", module, TESTS)
