"""A stack file that carries Pulumi's own top-level keys still plans offline.

`pulumi stack init --secrets-provider awskms://...` writes ``secretsprovider:`` and
``encryptedkey:`` at the top of ``stacks/Pulumi.<stack>.yaml`` (the passphrase provider writes
``encryptionsalt:``, and a stack may name an ESC ``environment:``); docs/stacks.md asks teams to
commit those lines. The offline plan and the program's config check must read ``config:`` alone
and take the file as it was before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stacks.config import STACKS_DIR, load_stack_config, read_stack_file
from stacks.mock_engine import PlanMocks, run_program, stack_config_strings
from stacks.plan import global_outputs

KMS = (
    'secretsprovider: "awskms://alias/llm-serving-pulumi?region=us-east-1"\n'
    "encryptedkey: AQICAHhhZGF0YWtleWNpcGhlcnRleHQ=\n"
)
PASSPHRASE = "encryptionsalt: v1:c2FsdA==:v1:aXY=:Y2lwaGVydGV4dA==\n"
ESC = "environment:\n  - llm-serving/shared\n"


def _with_pulumi_keys(tmp_path: Path, header: str) -> Path:
    """The shipped stack files, each with ``header`` above its ``config:`` as Pulumi writes it."""
    for shipped in STACKS_DIR.glob("Pulumi.*.yaml"):
        (tmp_path / shipped.name).write_text(header + shipped.read_text())
    return tmp_path


@pytest.mark.parametrize("header", [KMS, PASSPHRASE, KMS + ESC], ids=["kms", "passphrase", "esc"])
@pytest.mark.parametrize("stack", ["global", "dev-us-west-2", "prod-us-east-1"])
def test_pulumis_top_level_keys_leave_the_config_as_it_was(
    tmp_path: Path, header: str, stack: str
) -> None:
    stacks_dir = _with_pulumi_keys(tmp_path, header)
    path = stacks_dir / f"Pulumi.{stack}.yaml"
    assert read_stack_file(path) == read_stack_file(STACKS_DIR / path.name)
    assert load_stack_config(stack, stacks_dir=stacks_dir) == load_stack_config(stack)
    assert stack_config_strings(path) == stack_config_strings(STACKS_DIR / path.name)
    assert global_outputs(stacks_dir) == global_outputs()


def test_the_program_runs_on_a_stack_file_that_names_a_kms_key(tmp_path: Path) -> None:
    # What `make plan` does: the program under the mock engine, fed the file's config.
    runs = []
    for stacks_dir in (_with_pulumi_keys(tmp_path, KMS), STACKS_DIR):
        runs.append(
            run_program(
                STACKS_DIR / "__main__.py",
                "dev-us-west-2",
                stack_config_strings(stacks_dir / "Pulumi.dev-us-west-2.yaml"),
                PlanMocks(global_outputs(stacks_dir)),
            )
        )
    with_keys, shipped = runs
    assert with_keys.resources
    assert len(with_keys.resources) == len(shipped.resources)
    assert with_keys.outputs == shipped.outputs
