"""Every configured key of the project is one the program reads, in the offline plan and in a
real Pulumi run alike: a mistyped key fails naming it instead of reading as unset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacks.config import STACKS_DIR, RegionStackConfig, StackConfigError, load_stack_config
from stacks.mock_engine import PlanMocks, run_program, stack_config_strings

PROGRAM = STACKS_DIR / "__main__.py"


def _typo(tmp_path: Path) -> Path:
    """The dev stack with ``llm-serving:models`` mistyped: unread, it would delete every model."""
    config: dict[str, Any] = yaml.safe_load((STACKS_DIR / "Pulumi.dev-us-west-2.yaml").read_text())[
        "config"
    ]
    config["llm-serving:model"] = config.pop("llm-serving:models")
    path = tmp_path / "Pulumi.dev-us-west-2.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return path


def test_the_program_refuses_a_mistyped_key(tmp_path: Path) -> None:
    config = stack_config_strings(_typo(tmp_path))
    with pytest.raises(StackConfigError, match=r"llm-serving:model: unknown key; expected one of"):
        run_program(PROGRAM, "dev-us-west-2", config, PlanMocks({}))


def test_the_program_refuses_a_mistyped_key_passed_as_the_language_host_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `pulumi up` hands the program its whole configuration as JSON in PULUMI_CONFIG.
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(stack_config_strings(_typo(tmp_path))))
    with pytest.raises(StackConfigError, match=r"llm-serving:model: unknown key"):
        run_program(PROGRAM, "dev-us-west-2", {}, PlanMocks({}))


def test_a_getter_with_the_configured_keys_refuses_a_mistyped_key(tmp_path: Path) -> None:
    config = stack_config_strings(_typo(tmp_path))
    with pytest.raises(StackConfigError) as caught:
        load_stack_config("dev-us-west-2", get=config.get, configured=config.keys())
    assert caught.value.key == "llm-serving:model"


def test_a_getter_with_the_configured_keys_reads_a_good_stack() -> None:
    config = stack_config_strings(STACKS_DIR / "Pulumi.dev-us-west-2.yaml")
    loaded = load_stack_config("dev-us-west-2", get=config.get, configured=config.keys())
    assert isinstance(loaded, RegionStackConfig)
    assert [m.id for m in loaded.models] == ["catalog-ranker-8b", "fraud-xgb"]


def test_a_key_without_namespace_is_refused(tmp_path: Path) -> None:
    config = yaml.safe_load((STACKS_DIR / "Pulumi.dev-us-west-2.yaml").read_text())["config"]
    config["models"] = config.pop("llm-serving:models")
    (tmp_path / "Pulumi.dev-us-west-2.yaml").write_text(yaml.safe_dump({"config": config}))
    with pytest.raises(StackConfigError, match="models: keys need a namespace; write llm-serving"):
        load_stack_config("dev-us-west-2", stacks_dir=tmp_path)


def test_an_empty_value_is_checked_as_a_value_not_as_json(tmp_path: Path) -> None:
    config = yaml.safe_load((STACKS_DIR / "Pulumi.dev-us-west-2.yaml").read_text())["config"]
    config["llm-serving:domain"] = ""
    (tmp_path / "Pulumi.dev-us-west-2.yaml").write_text(yaml.safe_dump({"config": config}))
    with pytest.raises(StackConfigError) as caught:
        load_stack_config("dev-us-west-2", stacks_dir=tmp_path)
    assert caught.value.key == "llm-serving:domain"
    assert "JSON" not in str(caught.value)
    assert "String should match pattern" in str(caught.value)
