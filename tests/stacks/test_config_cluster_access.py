"""Stack configuration of the cluster layer: who reaches a created cluster's public API endpoint
(a required key, no default), and the size of Prometheus's volume."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacks.config import STACKS_DIR, RegionStackConfig, StackConfigError, load_stack_config

CREATED, ADOPTED = "dev-us-west-2", "prod-eu-west-1"


def _load(tmp_path: Path, stack: str, mutate: Callable[[dict[str, Any]], Any]) -> RegionStackConfig:
    config = yaml.safe_load((STACKS_DIR / f"Pulumi.{stack}.yaml").read_text())["config"]
    mutate(config)
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}))
    loaded = load_stack_config(stack, stacks_dir=tmp_path)
    assert isinstance(loaded, RegionStackConfig)
    return loaded


def _cluster(**keys: Any) -> Callable[[dict[str, Any]], None]:
    return lambda config: config["llm-serving:cluster"].update(keys)


def _observability(**keys: Any) -> Callable[[dict[str, Any]], None]:
    return lambda config: config.update({"llm-serving:observability": keys})


def _drop_cidrs(config: dict[str, Any]) -> None:
    config["llm-serving:cluster"].pop("public_access_cidrs")


@pytest.mark.parametrize(
    ("stack", "mutate", "key", "problem"),
    [
        (
            CREATED,
            _drop_cidrs,
            "llm-serving:cluster.public_access_cidrs",
            "missing required key for a created cluster: list who may reach the API's public "
            "endpoint",
        ),
        (
            CREATED,
            _cluster(public_access_cidrs=["5.6.7.0/24", "5.6.7.9/24"]),
            "llm-serving:cluster.public_access_cidrs[1]",
            "5.6.7.9/24 has host bits set; write 5.6.7.0/24 for the range or 5.6.7.9/32 for the "
            "one address",
        ),
        (
            CREATED,
            _cluster(public_access_cidrs=["10.20.0.0/16"]),
            "llm-serving:cluster.public_access_cidrs[0]",
            "10.20.0.0/16 is a private or reserved range, which EKS refuses",
        ),
        (
            CREATED,
            _cluster(public_access_cidrs=["0.0.0.0/0", "5.6.7.0/24"]),
            "llm-serving:cluster.public_access_cidrs",
            "0.0.0.0/0 admits every address, so the other ranges restrict nothing",
        ),
        (
            ADOPTED,
            _cluster(public_access_cidrs=["5.6.7.0/24"]),
            "llm-serving:cluster",
            "public_access_cidrs applies only to a created cluster (mode: create)",
        ),
        (
            CREATED,
            _observability(prometheus_storage_gib=10),
            "llm-serving:observability.prometheus_storage_gib",
            "greater than or equal to 20",
        ),
        (
            CREATED,
            _observability(prometheus_storage=50),
            "llm-serving:observability.prometheus_storage",
            "unknown key",
        ),
    ],
)
def test_bad_cluster_layer_config_names_the_key(
    tmp_path: Path, stack: str, mutate: Callable[[dict[str, Any]], Any], key: str, problem: str
) -> None:
    with pytest.raises(StackConfigError) as caught:
        _load(tmp_path, stack, mutate)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / f'Pulumi.{stack}.yaml'}: {key}: "), message
    assert problem in message


def test_an_empty_list_closes_the_public_endpoint(tmp_path: Path) -> None:
    config = _load(tmp_path, CREATED, _cluster(public_access_cidrs=[]))
    assert config.cluster.public_access_cidrs == []


def test_prometheus_storage_defaults_and_is_read(tmp_path: Path) -> None:
    assert _load(tmp_path, CREATED, lambda _: None).observability.prometheus_storage_gib == 50
    config = _load(tmp_path, CREATED, _observability(prometheus_storage_gib=120))
    assert config.observability.prometheus_storage_gib == 120


@pytest.mark.parametrize("stack", ["prod-us-east-1", "prod-ap-northeast-1", CREATED])
def test_shipped_created_clusters_state_their_public_ranges(stack: str) -> None:
    # They keep the open endpoint they had before the key existed, now written down.
    config = load_stack_config(stack)
    assert isinstance(config, RegionStackConfig)
    assert config.cluster.public_access_cidrs == ["0.0.0.0/0"]
