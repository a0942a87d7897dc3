"""No stack declares a deprecated pulumi-aws resource or sets a deprecated property.

pulumi-aws marks a deprecated resource class with a warning in its class body (emitted when its
package is imported, whether the class is used or not: the test configuration ignores those) and
a deprecated property with a ``DeprecationWarning`` when it is set, which this test records.
"""

from __future__ import annotations

import importlib
import inspect
import warnings

import pytest

from stacks.mock_engine import ProgramRun, run_program, stack_config_strings
from stacks.plan import REPO_ROOT, global_outputs
from tests.components.declared import KnownOutputMocks

STACKS = ["global", "prod-us-east-1", "prod-eu-west-1", "prod-ap-northeast-1", "dev-us-west-2"]


def _run(stack: str) -> tuple[ProgramRun, list[warnings.WarningMessage]]:
    stacks_dir = REPO_ROOT / "stacks"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = run_program(
            stacks_dir / "__main__.py",
            stack,
            stack_config_strings(stacks_dir / f"Pulumi.{stack}.yaml"),
            KnownOutputMocks(global_outputs(stacks_dir)),
            preview=False,
        )
    return run, caught


def _class_of(token: str) -> type:
    """The pulumi-aws class of a type token (``aws:s3/bucket:Bucket``)."""
    _, module_path, name = token.split(":")
    module = module_path.split("/")[0]
    package = "pulumi_aws" if module == "index" else f"pulumi_aws.{module.replace('-', '_')}"
    return getattr(importlib.import_module(package), name)


def _deprecated(cls: type) -> bool:
    head = inspect.getsource(cls).split("def ", 1)[0]
    return "deprecated" in head


def test_the_check_recognises_a_deprecated_class() -> None:
    assert _deprecated(_class_of("aws:s3/bucketV2:BucketV2"))
    assert not _deprecated(_class_of("aws:s3/bucket:Bucket"))


@pytest.mark.parametrize("stack", STACKS)
def test_stack_uses_no_deprecated_aws_resource_or_property(stack: str) -> None:
    run, caught = _run(stack)
    types = sorted({r.type for r in run.resources if r.type.startswith("aws:")})
    assert types
    assert [t for t in types if _deprecated(_class_of(t))] == []
    ours = [
        f"{w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if issubclass(w.category, DeprecationWarning)
        and "has been deprecated in favor of" not in str(w.message)
    ]
    assert ours == []
