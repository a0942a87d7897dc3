"""Fixtures that run components under Pulumi's mock engine."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stacks.mock_engine import run_program
from tests.components.declared import GLOBAL_OUTPUTS, Declare, Declared, KnownOutputMocks


@pytest.fixture
def declare() -> Declare:
    """``declare(fn, serving_mode=...)`` runs ``fn`` as a Pulumi program (outputs known)."""

    def run(program: Callable[[], None], serving_mode: str = "embedded") -> Declared:
        mocks = KnownOutputMocks(GLOBAL_OUTPUTS, serving_mode)
        return Declared(run_program(program, "test", {}, mocks, preview=False))

    return run
