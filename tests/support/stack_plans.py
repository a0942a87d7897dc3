"""The shipped region stacks and their plans under the mock engine, shared by the test files that
read them: each stack's program runs once per test session, however many files ask for its plan.

A plan from `stack_plan` is the same object for every caller: copy it (``copy.deepcopy``) before
changing it. A test that plans with other mocks or an edited stack file runs its own program.
"""

from __future__ import annotations

from functools import cache

from stacks.config import RegionStackConfig, load_stack_config
from stacks.mock_engine import ProgramRun
from stacks.plan import plan_program

REGION_STACKS = ("prod-us-east-1", "prod-eu-west-1", "prod-ap-northeast-1", "dev-us-west-2")
"""Every shipped stack but ``global``."""


@cache
def stack_plan(stack: str) -> ProgramRun:
    """``stack``'s plan as ``stacks.plan`` makes it (this checkout, the global stack's stand-in
    outputs), run on the first call and kept for the rest of the session."""
    return plan_program(stack)


def region_config(stack: str) -> RegionStackConfig:
    """The parsed stack file of a region stack."""
    config = load_stack_config(stack)
    assert isinstance(config, RegionStackConfig)
    return config
