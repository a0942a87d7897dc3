"""Stack configuration: every shipped stack file parses; bad or missing keys name key and file."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from stacks.config import (
    STACKS_DIR,
    GlobalStackConfig,
    RegionStackConfig,
    StackConfigError,
    load_stack_config,
    vllm_version_for,
)
from stacks.mock_engine import PlanMocks, run_program, stack_config_strings
from tests.support.stack_plans import REGION_STACKS


def _write(tmp_path: Path, stack: str, config: dict[str, Any]) -> Path:
    path = tmp_path / f"Pulumi.{stack}.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return path


def _base() -> dict[str, Any]:
    return yaml.safe_load((STACKS_DIR / "Pulumi.dev-us-west-2.yaml").read_text())["config"]


def _set_versions(
    config: dict[str, Any], first: dict[str, Any], second: dict[str, Any], **model: Any
) -> None:
    """Update the two versions of the base stack's versioned model (max_replicas 3)."""
    versions = config["llm-serving:models"][0]["versions"]
    assert len(versions) == 2
    versions[0].update(first)
    versions[1].update(second)
    config["llm-serving:models"][0].update(model)


def _red_black(model_id: str, version: str) -> dict[str, Any]:
    return {"id": model_id, "node_group": "l4-spot", "versions": [{"version": version}]}


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_region_stacks_parse(stack: str) -> None:
    config = load_stack_config(stack)
    assert isinstance(config, RegionStackConfig)
    assert stack.endswith(config.region)
    assert stack.startswith(config.environment)
    assert config.models, "every shipped stack serves at least one model"


def test_global_stack_parses() -> None:
    config = load_stack_config("global")
    assert isinstance(config, GlobalStackConfig)
    assert config.region not in config.replica_regions
    regions = {load_stack_config(s).region for s in REGION_STACKS}
    assert regions <= {config.region, *config.replica_regions}


def test_served_versions_follow_strategy() -> None:
    config = load_stack_config("prod-us-east-1")
    assert isinstance(config, RegionStackConfig)
    by_id = {m.id: m for m in config.models}
    red_black = by_id["llama-3-1-70b-instruct"]
    versioned = by_id["catalog-ranker-8b"]
    assert [v.version for v in red_black.served_versions] == [red_black.versions[-1].version]
    assert [v.version for v in versioned.served_versions] == [v.version for v in versioned.versions]


@pytest.mark.parametrize(
    ("mutate", "key", "problem"),
    [
        (lambda c: c.pop("llm-serving:cluster"), "llm-serving:cluster", "missing required key"),
        (lambda c: c.pop("aws:region"), "aws:region", "missing required key"),
        (
            lambda c: c["llm-serving:models"][0].update(strategy="canary"),
            "llm-serving:models[0].strategy",
            "'red-black' or 'versioned'",
        ),
        (
            lambda c: c["llm-serving:models"][0]["versions"][0].update(route_weight=120),
            "llm-serving:models[0].versions[0].route_weight",
            "less than or equal to 100",
        ),
        (
            lambda c: c["llm-serving:models"][0].pop("versions"),
            "llm-serving:models[0].versions",
            "missing required key",
        ),
        (
            lambda c: c["llm-serving:models"][0].update(node_group="h100"),
            "llm-serving:models",
            "unknown node group 'h100'",
        ),
        (
            lambda c: c["llm-serving:node_groups"][0].update(ami_type="AL2_x86_64_GPU"),
            "llm-serving:node_groups[0].ami_type",
            "AL2023_x86_64_NVIDIA",
        ),
        (
            lambda c: c["llm-serving:node_groups"][0].update(desired_size=9),
            "llm-serving:node_groups[0]",
            "min_size <= desired_size <= max_size",
        ),
        (
            lambda c: c["llm-serving:node_groups"][0].update(capacity_type="CAPACITY_BLOCK"),
            "llm-serving:node_groups[0]",
            "capacity_reservation_id is required",
        ),
        (
            lambda c: c["llm-serving:node_groups"][0].update(
                capacity_type="CAPACITY_BLOCK", capacity_reservation_id="cr-0abc"
            ),
            "llm-serving:node_groups[0]",
            "subnet_id (the subnet in the Capacity Block's Availability Zone) is required",
        ),
        (
            lambda c: c["llm-serving:node_groups"][0].update(
                capacity_type="CAPACITY_BLOCK",
                capacity_reservation_id="cr-0abc",
                subnet_id="subnet-0fff",
            ),
            "llm-serving:node_groups[0].subnet_id",
            "is not one of network.private_subnet_ids",
        ),
        (
            lambda c: c["llm-serving:model_cache"].update(subnet_id="subnet-0fff"),
            "llm-serving:model_cache.subnet_id",
            "subnet-0fff is not one of network.private_subnet_ids",
        ),
        (
            lambda c: c.update({"llm-serving:model_cache": {"storage_capacity_gib": 3000}}),
            "llm-serving:model_cache",
            "1200 or a multiple of 2400",
        ),
        (
            lambda c: c["llm-serving:model_cache"].update(restore_batch_size=64),
            "llm-serving:model_cache.restore_batch_size",
            "restore_batch_size was removed (materialize Jobs load files by reading them, with no "
            "lfs hsm_restore): delete it; verify_jobs sets how many files a Job reads at once",
        ),
        (
            lambda c: c["llm-serving:model_cache"].update(verify_jobs=0),
            "llm-serving:model_cache.verify_jobs",
            "greater than or equal to 1",
        ),
        (
            lambda c: c["llm-serving:models"][0].update(replica=2),
            "llm-serving:models[0].replica",
            "unknown key",
        ),
        (lambda c: c.update({"llm-serving:modles": []}), "llm-serving:modles", "unknown key"),
        (
            lambda c: c["llm-serving:image"].update(triton_release="26.07"),
            "llm-serving:image",
            "must end with -triton26.07",
        ),
        (lambda c: c.pop("llm-serving:domain"), "llm-serving:domain", "missing required key"),
        (
            lambda c: c["llm-serving:models"][0].update(strategy="red-black", replicas=0),
            "llm-serving:models[0]",
            "at least 1 for a red-black model",
        ),
        (
            lambda c: c.update({"llm-serving:domain": "Models_Example"}),
            "llm-serving:domain",
            "should match pattern",
        ),
        (
            lambda c: c["llm-serving:models"][0]["versions"][0].update(created_at="last week"),
            "llm-serving:models[0].versions[0].created_at",
            "valid date",
        ),
        (
            lambda c: _set_versions(c, {"route_weight": 10}, {"route_weight": 80}),
            "llm-serving:models[0].versions",
            "route_weight values sum to 90; they must sum to 100",
        ),
        (
            lambda c: _set_versions(c, {}, {"replicas": 5}),
            "llm-serving:models[0].versions[1].replicas",
            "5 is above the model's max_replicas (3)",
        ),
        (
            lambda c: _set_versions(c, {"version": "v1.0"}, {"version": "v1-0"}),
            "llm-serving:models[0].versions",
            "'v1.0' and 'v1-0' both become the Service name 'catalog-ranker-8b-v1-0'",
        ),
        (
            # Distinct Service names, but the same label in the version's routes and hostname.
            lambda c: _set_versions(c, {"version": "v1-.0"}, {"version": "v1..0"}),
            "llm-serving:models[0].versions",
            "both become the route and hostname label 'v1--0'",
        ),
        (
            lambda c: _set_versions(c, {"route_weight": 100}, {"version": "shared"}),
            "llm-serving:models[0].versions[1].version",
            "named like the model's shared weighted routes",
        ),
        (
            lambda c: _set_versions(c, {}, {"route_weight": 100}, strategy="red-black"),
            "llm-serving:models[0].versions[1].route_weight",
            "route_weight applies to versioned models only",
        ),
        (
            lambda c: c["llm-serving:models"][0].update(id="8b-catalog-ranker"),
            "llm-serving:models[0].id",
            "must start with a letter",
        ),
        (
            lambda c: c["llm-serving:models"].append(_red_black("catalog-ranker-8b-v4", "1")),
            "llm-serving:models[2].id",
            "version 'v4' of model 'catalog-ranker-8b' both name the workload "
            "'catalog-ranker-8b-v4'",
        ),
        (
            lambda c: c.update(
                {"llm-serving:models": [_red_black("ranker", "b-c"), _red_black("ranker-b", "c")]}
            ),
            "llm-serving:models[1].versions[0].version",
            "both name the materialize Job 'materialize-ranker-b-c'",
        ),
    ],
)
def test_bad_config_names_key_and_file(tmp_path: Path, mutate: Any, key: str, problem: str) -> None:
    config = _base()
    mutate(config)
    path = _write(tmp_path, "dev-us-west-2", config)
    with pytest.raises(StackConfigError) as caught:
        load_stack_config("dev-us-west-2", stacks_dir=tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {key}")
    assert problem in message
    assert caught.value.key == key


def test_missing_stack_file(tmp_path: Path) -> None:
    with pytest.raises(StackConfigError, match="stack file not found"):
        load_stack_config("prod-mars-1", stacks_dir=tmp_path)


def test_values_read_through_getter_are_json() -> None:
    # In a Pulumi run structured values arrive as JSON strings.
    import json

    raw = _base()
    encoded = {k: v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}
    config = load_stack_config("dev-us-west-2", get=encoded.get)
    assert config == load_stack_config("dev-us-west-2")


def test_created_at_is_a_date() -> None:
    config = load_stack_config("prod-us-east-1")
    assert isinstance(config, RegionStackConfig)
    ranker = next(m for m in config.models if m.strategy == "versioned")
    assert [v.created_at for v in ranker.versions] == [date(2026, 9, 20), date(2026, 11, 2)]


def _unknown_release(tmp_path: Path) -> Path:
    config = _base()
    config["llm-serving:image"] = {"tag": "0.1.0-triton24.01", "triton_release": "24.01"}
    return _write(tmp_path, "dev-us-west-2", config)


def test_unknown_triton_release_names_the_key_and_the_supported_releases(tmp_path: Path) -> None:
    path = _unknown_release(tmp_path)
    config = load_stack_config("dev-us-west-2", stacks_dir=tmp_path)
    assert isinstance(config, RegionStackConfig)
    with pytest.raises(StackConfigError) as caught:
        vllm_version_for(config, "dev-us-west-2", stacks_dir=tmp_path)
    assert caught.value.key == "llm-serving:image.triton_release"
    message = str(caught.value)
    assert message.startswith(f"{path}: llm-serving:image.triton_release: ")
    assert "'24.01'" in message
    assert "supported releases: " in message
    assert "26.08" in message


def test_the_stack_program_refuses_an_unknown_triton_release(tmp_path: Path) -> None:
    path = _unknown_release(tmp_path)
    program = STACKS_DIR / "__main__.py"
    with pytest.raises(StackConfigError, match=r"llm-serving:image\.triton_release: .*supported"):
        run_program(program, "dev-us-west-2", stack_config_strings(path), PlanMocks({}))


def test_a_known_release_gives_its_vllm() -> None:
    config = load_stack_config("prod-us-east-1")
    assert isinstance(config, RegionStackConfig)
    assert vllm_version_for(config, "prod-us-east-1") == "0.27.1"


def test_the_rollouts_guide_example_is_a_valid_models_list(tmp_path: Path) -> None:
    # The first YAML block of docs/rollouts.md is what users paste into a stack file.
    guide = (STACKS_DIR.parent / "docs" / "rollouts.md").read_text()
    example = yaml.safe_load(guide.split("```yaml\n", 1)[1].split("```", 1)[0])
    config = yaml.safe_load((STACKS_DIR / "Pulumi.prod-us-east-1.yaml").read_text())["config"]
    config["llm-serving:models"] = example["llm-serving:models"]
    _write(tmp_path, "prod-us-east-1", config)
    loaded = load_stack_config("prod-us-east-1", stacks_dir=tmp_path)
    assert [m.id for m in loaded.models] == ["llama-3-1-70b-instruct", "catalog-ranker-8b"]


def test_shipped_stacks_serve_weights_that_sum_to_100() -> None:
    # The weight check must not refuse what the shipped stacks deploy.
    for stack in REGION_STACKS:
        config = load_stack_config(stack)
        assert isinstance(config, RegionStackConfig)
        for model in config.models:
            weights = [v.route_weight for v in model.versions if v.route_weight is not None]
            assert not weights or sum(weights) == 100


def test_replica_regions_listed_twice(tmp_path: Path) -> None:
    config = yaml.safe_load((STACKS_DIR / "Pulumi.global.yaml").read_text())["config"]
    config["llm-serving:replica_regions"].append(config["llm-serving:replica_regions"][0])
    path = _write(tmp_path, "global", config)
    with pytest.raises(StackConfigError) as caught:
        load_stack_config("global", stacks_dir=tmp_path)
    assert caught.value.key == "llm-serving:replica_regions"
    assert str(caught.value).startswith(f"{path}: llm-serving:replica_regions: ")
    assert "more than once" in str(caught.value)


def test_stack_config_errors_print_without_a_traceback_in_pulumi_up(tmp_path: Path) -> None:
    # The Pulumi CLI's Python host logs a RunError's message alone, anything else with the
    # program's traceback.
    config = _base()
    config["llm-serving:models"][0]["versions"][0]["route_weight"] = 10
    path = _write(tmp_path, "dev-us-west-2", config)
    with pytest.raises(pulumi.RunError, match=r"llm-serving:models\[0\]\.versions: route_weight"):
        run_program(
            STACKS_DIR / "__main__.py",
            "dev-us-west-2",
            stack_config_strings(path),
            PlanMocks({}),
        )


def test_a_model_named_like_the_grpc_subdomain_is_refused(tmp_path: Path) -> None:
    # Its OpenAI hostnames <version>.grpc.<domain> would be other models' gRPC hostnames.
    config = _base()
    config["llm-serving:models"][0]["id"] = "grpc"
    _write(tmp_path, "dev-us-west-2", config)
    with pytest.raises(StackConfigError, match="subdomain of the gRPC hostnames") as caught:
        load_stack_config("dev-us-west-2", stacks_dir=tmp_path)
    assert caught.value.key == "llm-serving:models[0].id"
