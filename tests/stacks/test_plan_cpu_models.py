"""The dev stack's plan with its CPU model: a tainted CPU node group, a pod without GPU request or
GPU toleration pinned there, KEDA on Triton's queue time; the cross-object check fails a CPU pod
that cannot land on its group."""

from __future__ import annotations

import copy
from typing import Any

from components.cpu_node_group import CPU_MODELS_TAINT
from contracts.labels import GPU_RESOURCE, NODE_GROUP_LABEL
from stacks.kubernetes_objects import kubernetes_objects
from stacks.mock_engine import ProgramRun, RecordedResource
from stacks.plan_checks import CHECKS
from tests.support.stack_plans import stack_plan

STACK = "dev-us-west-2"
CPU_GROUP = f"{STACK}-cpu"
FITS = "pods fit their node group"


def _run() -> ProgramRun:
    """The dev stack's plan, shared with the other files that plan it (copy before changing)."""
    return stack_plan(STACK)


def _object(run: ProgramRun, kind: str, name: str) -> dict[str, Any]:
    (manifest,) = [
        m for _, m in kubernetes_objects(run) if (m["kind"], m["metadata"]["name"]) == (kind, name)
    ]
    return manifest


def _cpu_node_group(run: ProgramRun) -> RecordedResource:
    (group,) = [
        r
        for r in run.resources
        if r.type == "aws:eks/nodeGroup:NodeGroup"
        and r.inputs["labels"].get(NODE_GROUP_LABEL) == CPU_GROUP
    ]
    return group


def test_the_cpu_node_group_is_tainted_and_has_no_gpu_types() -> None:
    group = _cpu_node_group(_run()).inputs
    assert group["amiType"] == "AL2023_x86_64_STANDARD"
    assert group["instanceTypes"] == ["c7i.xlarge", "c7i.2xlarge"]
    assert group["taints"] == [{"key": CPU_MODELS_TAINT, "effect": "NO_SCHEDULE"}]


def test_the_cpu_model_requests_no_gpu_and_tolerates_only_its_group() -> None:
    pod = _object(_run(), "Deployment", "fraud-xgb-v1")["spec"]["template"]["spec"]
    for container in pod["containers"]:
        for side in ("requests", "limits"):
            assert GPU_RESOURCE not in container["resources"][side]
    assert pod["tolerations"] == [
        {"key": CPU_MODELS_TAINT, "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert pod["nodeSelector"] == {NODE_GROUP_LABEL: CPU_GROUP}
    # The LLM of the same stack keeps its GPU request and toleration.
    llm = _object(_run(), "Deployment", "catalog-ranker-8b-v4")["spec"]["template"]["spec"]
    assert llm["containers"][0]["resources"]["limits"][GPU_RESOURCE] == "1"
    assert [t["key"] for t in llm["tolerations"]] == [GPU_RESOURCE]


def test_keda_scales_the_cpu_model_on_triton_queue_time_and_the_llm_on_its_queue() -> None:
    (trigger,) = _object(_run(), "ScaledObject", "fraud-xgb-v1")["spec"]["triggers"]
    matchers = 'model_id="fraud-xgb",model_version="v1"'
    assert trigger["metricType"] == "Value"
    assert trigger["metadata"]["threshold"] == "20000"
    assert trigger["metadata"]["query"] == (
        f"(sum(rate(nv_inference_queue_duration_us{{{matchers}}}[1m])) / "
        f"(sum(rate(nv_inference_request_success{{{matchers}}}[1m])) > 0)) or vector(0)"
    )
    (llm,) = _object(_run(), "ScaledObject", "catalog-ranker-8b-v4")["spec"]["triggers"]
    assert llm["metricType"] == "AverageValue"
    assert llm["metadata"]["query"].startswith("sum(vllm:num_requests_waiting{")


def test_the_dev_plan_passes_the_fit_check() -> None:
    assert CHECKS[FITS](_run()) == []


def _broken() -> tuple[ProgramRun, RecordedResource, dict[str, Any]]:
    run = copy.deepcopy(_run())
    (deployment,) = [
        r
        for r in run.resources
        if r.type == "kubernetes:apps/v1:Deployment" and "fraud-xgb-v1" in r.name
    ]
    return run, _cpu_node_group(run), deployment.inputs["spec"]["template"]["spec"]


def test_a_cpu_pod_without_the_cpu_toleration_fails() -> None:
    run, _, pod = _broken()
    pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    (problem,) = CHECKS[FITS](run)
    assert "fraud-xgb-v1" in problem and "does not tolerate the taint" in problem
    assert CPU_MODELS_TAINT in problem


def test_a_cpu_pod_that_does_not_fit_a_cpu_type_fails() -> None:
    run, group, _ = _broken()
    group.inputs["instanceTypes"] = ["c7i.large", *group.inputs["instanceTypes"]]
    (problem,) = CHECKS[FITS](run)
    assert "fraud-xgb-v1" in problem and "does not fit c7i.large (cpu, memory" in problem
