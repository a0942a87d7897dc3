"""Pinned EKS AMI releases in the stack configuration: each node group's ``release_version`` has
its AMI family's form, and an Amazon Linux release runs the cluster's Kubernetes version."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacks.config import STACKS_DIR, RegionStackConfig, StackConfigError, load_stack_config

# Real releases: the EKS AL2023 AMIs of 2025-07-04 for Kubernetes 1.33, and a Bottlerocket
# 1.34.0 build (docs/stacks.md#pinning-the-ami-release says where current ones are published).
AL2023 = "1.33.0-20250704"
BOTTLEROCKET = "1.34.0-18d04e52"

Edit = Callable[[dict[str, Any]], None]


def _base(stack: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((STACKS_DIR / f"Pulumi.{stack}.yaml").read_text())
    return config["config"]


def _load(tmp_path: Path, stack: str, edit: Edit) -> RegionStackConfig:
    config = _base(stack)
    edit(config)
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}))
    loaded = load_stack_config(stack, stacks_dir=tmp_path)
    assert isinstance(loaded, RegionStackConfig)
    return loaded


def _pin(key: str, index: int | None, release: str, **more: Any) -> Edit:
    """Set ``release_version`` (and ``more``) on ``llm-serving:<key>[index]``, or on
    ``cluster.system_nodes`` for ``key="cluster"``."""

    def edit(config: dict[str, Any]) -> None:
        value = config[f"llm-serving:{key}"]
        if key == "cluster":
            value.setdefault("system_nodes", {})["release_version"] = release
            value.update(more)
        else:
            value[index].update(release_version=release, **more)

    return edit


def test_shipped_stacks_leave_the_release_to_eks() -> None:
    # Unpinned: EKS picks the newest release when a group is created or upgraded.
    config = load_stack_config("prod-us-east-1")
    assert isinstance(config, RegionStackConfig)
    releases = [
        *(g.release_version for g in config.node_groups),
        *(g.release_version for g in config.cpu_node_groups),
        config.cluster.system_nodes.release_version,
    ]
    assert releases == [None] * len(releases)


def test_a_release_of_each_family_is_accepted(tmp_path: Path) -> None:
    def pin_all(config: dict[str, Any]) -> None:
        # dev-us-west-2: a Bottlerocket GPU group, an AL2023 CPU group, cluster 1.33 (default).
        _pin("node_groups", 0, BOTTLEROCKET)(config)
        _pin("cpu_node_groups", 0, AL2023)(config)
        _pin("cluster", None, AL2023)(config)

    config = _load(tmp_path, "dev-us-west-2", pin_all)
    assert config.node_groups[0].release_version == BOTTLEROCKET
    assert config.cpu_node_groups[0].release_version == AL2023
    assert config.cluster.system_nodes.release_version == AL2023


def test_an_adopted_cluster_states_its_version_to_pin_amazon_linux(tmp_path: Path) -> None:
    # prod-eu-west-1 adopts its cluster (its version is read at pulumi up); l40s runs AL2023.
    def pin(config: dict[str, Any]) -> None:
        config["llm-serving:cluster"]["version"] = "1.33"
        _pin("node_groups", 0, AL2023)(config)

    config = _load(tmp_path, "prod-eu-west-1", pin)
    assert config.node_groups[0].release_version == AL2023


@pytest.mark.parametrize(
    ("stack", "edit", "key", "problem"),
    [
        (
            "dev-us-west-2",
            _pin("cpu_node_groups", 0, "1.33-20250704"),
            "llm-serving:cpu_node_groups[0].release_version",
            "'1.33-20250704' is not an Amazon Linux 2023 release: expected <Kubernetes "
            "major.minor.patch>-<YYYYMMDD>, such as 1.33.0-20250704 (aws ssm get-parameter --name "
            "/aws/service/eks/optimized-ami/<cluster.version>/amazon-linux-2023/x86_64/standard/"
            "recommended/release_version)",
        ),
        (
            "dev-us-west-2",
            _pin("cluster", None, "v20250704"),
            "llm-serving:cluster.system_nodes.release_version",
            "'v20250704' is not an Amazon Linux 2023 release",
        ),
        (
            "dev-us-west-2",
            _pin("node_groups", 0, "1.34.0"),
            "llm-serving:node_groups[0].release_version",
            "'1.34.0' is not a Bottlerocket release: expected <OS version>-<8-hex-digit commit>, "
            "such as 1.34.0-18d04e52 (aws ssm get-parameter --name /aws/service/bottlerocket/"
            "aws-k8s-<cluster.version>-nvidia/x86_64/latest/image_version)",
        ),
        (
            # An Amazon Linux release copied onto a Bottlerocket group.
            "prod-us-east-1",
            _pin("node_groups", 1, AL2023),
            "llm-serving:node_groups[1].release_version",
            f"{AL2023!r} is not a Bottlerocket release",
        ),
        (
            "prod-us-east-1",
            _pin("node_groups", 0, "1.32.9-20251016"),
            "llm-serving:node_groups[0].release_version",
            "1.32.9-20251016 runs Kubernetes 1.32, but cluster.version is 1.33 and EKS refuses a "
            "release of another Kubernetes version; pin a 1.33 release (aws ssm get-parameter "
            "--name /aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/nvidia/"
            "recommended/release_version), changing it together with cluster.version",
        ),
        (
            "dev-us-west-2",
            _pin("cpu_node_groups", 0, "1.34.1-20250920"),
            "llm-serving:cpu_node_groups[0].release_version",
            "runs Kubernetes 1.34, but cluster.version is 1.33",
        ),
        (
            # The cluster upgraded without its pinned system nodes' release.
            "prod-us-east-1",
            _pin("cluster", None, AL2023, version="1.34"),
            "llm-serving:cluster.system_nodes.release_version",
            "runs Kubernetes 1.33, but cluster.version is 1.34",
        ),
        (
            "prod-eu-west-1",
            _pin("node_groups", 0, AL2023),
            "llm-serving:node_groups[0].release_version",
            "an adopted cluster's version is read only at pulumi up: set cluster.version",
        ),
    ],
)
def test_a_release_that_cannot_run_names_its_key(
    tmp_path: Path, stack: str, edit: Edit, key: str, problem: str
) -> None:
    with pytest.raises(StackConfigError) as caught:
        _load(tmp_path, stack, edit)
    assert caught.value.key == key
    assert str(caught.value).startswith(f"{tmp_path / f'Pulumi.{stack}.yaml'}: {key}: ")
    assert problem in str(caught.value)
