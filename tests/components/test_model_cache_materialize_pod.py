"""The materialize Job's pod runs only what the serving image is known to hold: no other image,
no shell, no added capability. A restore step in a tools image that lacked bash (the FSx CSI
driver's) would fail every Job while a test running its script with the host's tools passed."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

from components.model_cache import ModelCache, ModelCacheArgs
from tests.components.declared import Declare, Declared

SERVING_IMAGE = "111.dkr.ecr.us-east-1.amazonaws.com/llm:0.1.0-triton26.08"
SHELLS = {"sh", "bash", "ash", "dash", "zsh", "busybox"}


@pytest.fixture
def pods(declare: Declare) -> list[dict[str, Any]]:
    args = ModelCacheArgs(
        vpc_id="vpc-1",
        subnet_id="subnet-1",
        node_security_group_id="sg-nodes",
        bucket_name="models-use1",
        namespace="serving",
        versions=[("llama", "v1"), ("ranker", "2026.11")],
        serving_image=SERVING_IMAGE,
        client_node_groups=["r-h100"],
    )
    declared: Declared = declare(lambda: ModelCache("cache", args))
    jobs = declared.of_type("kubernetes:batch/v1:Job")
    assert len(jobs) == 2
    return [job.inputs["spec"]["template"]["spec"] for job in jobs]


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    kinds = ("initContainers", "containers", "ephemeralContainers")
    return [container for kind in kinds for container in pod.get(kind, [])]


def test_every_container_runs_the_serving_image(pods: list[dict[str, Any]]) -> None:
    for pod in pods:
        assert [c["name"] for c in _containers(pod)] == ["verify"]
        assert {c["image"] for c in _containers(pod)} == {SERVING_IMAGE}


def test_no_container_runs_a_shell(pods: list[dict[str, Any]]) -> None:
    for pod in pods:
        for container in _containers(pod):
            argv = [*container.get("command", []), *container.get("args", [])]
            assert argv[:3] == ["python3", "-m", "runtime.cli"], argv
            assert not SHELLS & {PurePosixPath(a).name for a in argv}, argv


def test_no_container_gains_a_capability_or_privilege(pods: list[dict[str, Any]]) -> None:
    for pod in pods:
        for container in _containers(pod):
            context = container.get("securityContext", {})
            assert not context.get("capabilities", {}).get("add"), container["name"]
            assert context.get("privileged") is not True, container["name"]
            assert context.get("allowPrivilegeEscalation") is False, container["name"]


def test_default_verify_jobs_read_16_files_at_once(pods: list[dict[str, Any]]) -> None:
    for pod in pods:
        (verify,) = pod["containers"]
        assert verify["command"][5:7] == ["--jobs", "16"]
