"""Instance-type fit: every instance type of a model's node group must hold the model's pod
after the node's reserved capacity, from the specifications in ``stacks/instance_types.yaml``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.model_service.args import pod_requests
from stacks.config import STACKS_DIR, StackConfigError, load_stack_config
from stacks.instance_types import allocatable, instance_specs, max_pods
from tests.support.stack_plans import REGION_STACKS


def _config(stack: str) -> dict[str, Any]:
    return yaml.safe_load((STACKS_DIR / f"Pulumi.{stack}.yaml").read_text())["config"]


def _load(tmp_path: Path, stack: str, config: dict[str, Any]) -> object:
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}))
    return load_stack_config(stack, stacks_dir=tmp_path)


def test_the_old_ap_northeast_1_l4_spot_group_is_refused(tmp_path: Path) -> None:
    # The shipped file before the fix: g6.xlarge (4 vCPU, 16 GiB) in l4-spot, whose model
    # catalog-ranker-8b requests 6 CPU and 24 GiB plus the metrics proxy's 250m and 256 MiB.
    config = _config("prod-ap-northeast-1")
    config["llm-serving:node_groups"][1]["instance_types"] = ["g6.xlarge", "g6.2xlarge"]
    with pytest.raises(StackConfigError) as caught:
        _load(tmp_path, "prod-ap-northeast-1", config)
    assert caught.value.key == "llm-serving:node_groups[1].instance_types[0]"
    message = str(caught.value)
    for named in ("'catalog-ranker-8b'", "'l4-spot'", "g6.xlarge", "CPU 6.25 > 3.92"):
        assert named in message
    assert "memory GiB 24.25 > 14.47" in message


def test_a_model_too_large_for_every_type_names_the_first(tmp_path: Path) -> None:
    config = _config("dev-us-west-2")
    config["llm-serving:models"][0]["memory_gib"] = 64
    with pytest.raises(
        StackConfigError, match=r"instance type g6\.2xlarge of node group 'l4-spot'"
    ):
        _load(tmp_path, "dev-us-west-2", config)


def test_an_unknown_instance_type_lists_the_families(tmp_path: Path) -> None:
    config = _config("dev-us-west-2")
    config["llm-serving:node_groups"][0]["instance_types"] = ["g6.2xlarge", "g7.2xlarge"]
    with pytest.raises(
        StackConfigError, match=re.escape("'g7.2xlarge' is not in stacks/instance_types.yaml")
    ):
        _load(tmp_path, "dev-us-west-2", config)


def test_gpus_per_node_must_match_the_types(tmp_path: Path) -> None:
    config = _config("prod-eu-west-1")
    config["llm-serving:node_groups"][0]["instance_types"] = ["g6e.12xlarge", "g6e.16xlarge"]
    with pytest.raises(
        StackConfigError, match=re.escape("g6e.16xlarge has 1 GPUs but gpus_per_node is 4")
    ):
        _load(tmp_path, "prod-eu-west-1", config)


def test_system_node_types_come_from_the_table(tmp_path: Path) -> None:
    config = _config("dev-us-west-2")
    config["llm-serving:cluster"]["system_nodes"] = {"instance_types": ["t3.nano"]}
    with pytest.raises(StackConfigError, match=re.escape("'t3.nano' is not in")):
        _load(tmp_path, "dev-us-west-2", config)


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_every_shipped_model_fits_every_type_of_its_group(stack: str) -> None:
    config = _config(stack)
    kinds = ("llm-serving:node_groups", "llm-serving:cpu_node_groups")
    groups = {g["name"]: g for kind in kinds for g in config.get(kind, [])}
    for model in config["llm-serving:models"]:
        wanted = pod_requests(model.get("cpu", 8), model.get("memory_gib", 64), model["gpus"])
        for name in groups[model["node_group"]]["instance_types"]:
            free = allocatable(instance_specs()[name])
            assert wanted.cpu_milli <= free.cpu_milli, (stack, model["id"], name)
            assert wanted.memory_mib <= free.memory_mib, (stack, model["id"], name)
            assert wanted.gpus <= free.gpus, (stack, model["id"], name)


def test_reserved_capacity_follows_the_eks_formula() -> None:
    g6 = instance_specs()["g6.xlarge"]
    assert (g6.vcpus, g6.memory_gib, g6.gpus) == (4, 16, 1)
    # 110 pods: 255 + 11 x 110 MiB kube-reserved, 100 MiB eviction; 60+10+5+5 millicores.
    assert max_pods(g6) == 110
    assert allocatable(g6).memory_mib == 16 * 1024 - (255 + 11 * 110 + 100)
    assert allocatable(g6).cpu_milli == 4000 - 80
    p5 = instance_specs()["p5.48xlarge"]
    assert max_pods(p5) == 250
    assert allocatable(p5).cpu_milli == 192_000 - (80 + 2.5 * 188)
    families = {name.split(".")[0] for name in instance_specs()}
    assert {"p4d", "p5", "p5e", "g5", "g6", "g6e", "m6i"} <= families
