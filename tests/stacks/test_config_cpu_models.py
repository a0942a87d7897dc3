"""CPU models in the stack configuration: ``cpu_node_groups``, ``gpus: 0`` and ``scaling``; each
bad combination names the key and says what to change."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacks.config import (
    STACKS_DIR,
    RegionStackConfig,
    ScalingConfig,
    StackConfigError,
    load_stack_config,
)

STACK = "dev-us-west-2"
LLM, CPU_MODEL = 0, 1


def _base() -> dict[str, Any]:
    return yaml.safe_load((STACKS_DIR / f"Pulumi.{STACK}.yaml").read_text())["config"]


def _load(tmp_path: Path, config: dict[str, Any]) -> RegionStackConfig:
    (tmp_path / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump({"config": config}))
    loaded = load_stack_config(STACK, stacks_dir=tmp_path)
    assert isinstance(loaded, RegionStackConfig)
    return loaded


def _model(config: dict[str, Any], index: int) -> dict[str, Any]:
    model: dict[str, Any] = config["llm-serving:models"][index]
    return model


def test_the_dev_stack_serves_a_cpu_model_on_a_cpu_group() -> None:
    config = load_stack_config(STACK)
    assert isinstance(config, RegionStackConfig)
    llm, fraud = config.models
    assert (fraud.id, fraud.gpus, fraud.node_group) == ("fraud-xgb", 0, "cpu")
    assert [g.name for g in config.cpu_node_groups] == ["cpu"]
    assert fraud.trigger == ScalingConfig(metric="queue_time_us", target=20000)
    # LLMs keep scaling on vLLM's waiting requests unless the stack says otherwise.
    assert llm.scaling is None
    assert llm.trigger == ScalingConfig(metric="queue_size", target=8)


def _cpu_group(**changes: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: c["llm-serving:cpu_node_groups"][0].update(changes)


def _cpu_model(**changes: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: _model(c, CPU_MODEL).update(changes)


def _without_scaling(c: dict[str, Any]) -> None:
    del _model(c, CPU_MODEL)["scaling"]


def _also_a_gpu_group(c: dict[str, Any]) -> None:
    c["llm-serving:cpu_node_groups"][0]["name"] = "l4-spot"


@pytest.mark.parametrize(
    ("mutate", "key", "problem"),
    [
        (
            _cpu_model(node_group="l4-spot"),
            "llm-serving:models[1].gpus",
            "0 GPUs, but node group 'l4-spot' is a GPU group (node_groups); name a group of "
            "cpu_node_groups for a CPU model, or request GPUs",
        ),
        (
            lambda c: _model(c, LLM).update(node_group="cpu"),
            "llm-serving:models[0].gpus",
            "1 GPUs, but node group 'cpu' is a CPU group (cpu_node_groups); set gpus: 0, or "
            "name a GPU group of node_groups",
        ),
        (
            _cpu_model(node_group="cpu2"),
            "llm-serving:models",
            "unknown node group 'cpu2'; expected one of: l4-spot, cpu",
        ),
        (
            _cpu_model(strategy="red-black"),
            "llm-serving:models[1].strategy",
            "a CPU model (gpus: 0) cannot be red-black",
        ),
        (
            _without_scaling,
            "llm-serving:models[1].scaling",
            "a CPU model (gpus: 0) with max_replicas needs scaling",
        ),
        (
            _cpu_model(scaling={"metric": "queue_size", "target": 8}),
            "llm-serving:models[1].scaling.metric",
            "use queue_time_us or inference_rate",
        ),
        (
            _cpu_model(scaling={"metric": "latency", "target": 8}),
            "llm-serving:models[1].scaling.metric",
            "'queue_size', 'queue_time_us' or 'inference_rate'",
        ),
        (
            _cpu_model(scaling={"metric": "inference_rate", "target": 0}),
            "llm-serving:models[1].scaling.target",
            "greater than or equal to 1",
        ),
        (
            _cpu_model(max_replicas=None),
            "llm-serving:models[1].scaling",
            "scaling applies only with max_replicas",
        ),
        (
            lambda c: _model(c, LLM).update(max_replicas=3, queue_target=4),
            "llm-serving:models[0].queue_target",
            "queue_target became scaling: write scaling: {metric: queue_size, target: 4} instead",
        ),
        (
            _cpu_group(instance_types=["c7i.xlarge", "g6.2xlarge"]),
            "llm-serving:cpu_node_groups[0].instance_types[1]",
            "g6.2xlarge has 1 GPUs; a CPU node group's types have none",
        ),
        (
            _cpu_group(instance_types=["c8i.xlarge"]),
            "llm-serving:cpu_node_groups[0].instance_types[0]",
            "'c8i.xlarge' is not in stacks/instance_types.yaml",
        ),
        (
            _cpu_group(ami_type="AL2023_x86_64_NVIDIA"),
            "llm-serving:cpu_node_groups[0].ami_type",
            "'AL2023_x86_64_STANDARD' or 'BOTTLEROCKET_x86_64'",
        ),
        (
            _cpu_group(capacity_type="CAPACITY_BLOCK"),
            "llm-serving:cpu_node_groups[0].capacity_type",
            "'ON_DEMAND' or 'SPOT'",
        ),
        (
            _cpu_group(gpus_per_node=0),
            "llm-serving:cpu_node_groups[0].gpus_per_node",
            "unknown key",
        ),
        (
            _also_a_gpu_group,
            "llm-serving:cpu_node_groups",
            "l4-spot also named in node_groups",
        ),
    ],
)
def test_bad_cpu_model_configuration_names_the_key(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], None], key: str, problem: str
) -> None:
    config = _base()
    mutate(config)
    with pytest.raises(StackConfigError) as caught:
        _load(tmp_path, config)
    assert caught.value.key == key
    assert problem in str(caught.value)


def test_a_cpu_model_that_does_not_fit_a_cpu_type_names_it(tmp_path: Path) -> None:
    # c7i.xlarge: 4 vCPU and 8 GiB leave 3.92 CPU and 6.47 GiB after the node's reserve.
    config = _base()
    _model(config, CPU_MODEL).update(memory_gib=8)
    with pytest.raises(StackConfigError) as caught:
        _load(tmp_path, config)
    assert caught.value.key == "llm-serving:cpu_node_groups[0].instance_types[0]"
    message = str(caught.value)
    assert "model 'fraud-xgb' (models[1]) does not fit instance type c7i.xlarge" in message
    assert "of node group 'cpu'" in message and "memory GiB 8.25 > 6.47" in message
    assert "GPUs" not in message.split("requests")[1].split(";")[0]


def test_a_cpu_model_may_scale_on_inference_rate(tmp_path: Path) -> None:
    config = _base()
    _model(config, CPU_MODEL)["scaling"] = {"metric": "inference_rate", "target": 400}
    fraud = _load(tmp_path, config).models[CPU_MODEL]
    assert fraud.trigger == ScalingConfig(metric="inference_rate", target=400)


def test_an_llm_may_scale_on_triton_queue_time(tmp_path: Path) -> None:
    config = _base()
    _model(config, LLM)["scaling"] = {"metric": "queue_time_us", "target": 500000}
    llm = _load(tmp_path, config).models[LLM]
    assert llm.trigger == ScalingConfig(metric="queue_time_us", target=500000)
