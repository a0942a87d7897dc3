"""The relay and gate tests rerun against an AddressSanitizer + UndefinedBehaviorSanitizer build
of the gate's native relay (``tests/support/sanitized.py``)."""

from __future__ import annotations

import pytest

from tests.support.sanitized import build_sanitized, run_tests_against

TESTS = ["tests/runtime/test_entrypoint_gate_relay.py", "tests/runtime/test_entrypoint_gate.py"]


@pytest.mark.sanitize
@pytest.mark.timeout(900)
def test_relay_tests_pass_under_asan_and_ubsan() -> None:
    module = build_sanitized("_relay", "csrc/relay/_relay*.so")
    run_tests_against("runtime.entrypoint._relay", module, TESTS)
