"""Cross-object checks over the real plans of every region stack, each shown to fail on a broken
copy of a real plan."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from stacks.mock_engine import ProgramRun, RecordedResource
from stacks.plan_checks import CHECKS, check_plan
from tests.support.stack_plans import REGION_STACKS, stack_plan


def _broken(stack: str, pick: Callable[[RecordedResource], bool]) -> tuple[ProgramRun, list]:
    """A deep copy of ``stack``'s plan and the copies of its resources that ``pick`` selects."""
    run = copy.deepcopy(stack_plan(stack))
    return run, [r for r in run.resources if pick(r)]


def _kind(kind: str, name_part: str = "") -> Callable[[RecordedResource], bool]:
    return lambda r: r.type.endswith(kind) and name_part in r.name


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_every_region_plan_passes_every_check(stack: str) -> None:
    assert [f"{f.check}: {f.message}" for f in check_plan(stack_plan(stack))] == []


def test_routes_sharing_a_hostname_on_one_listener_fail() -> None:
    # What the stacks did before gRPC got its own hostnames: both routes on <model>.<domain>.
    run, routes = _broken("prod-us-east-1", _kind("Route", "llama"))
    grpc, http = sorted(routes, key=lambda r: r.type)
    grpc.inputs["spec"]["hostnames"] = list(http.inputs["spec"]["hostnames"])
    (problem,) = CHECKS["route hostnames"](run)
    assert "listener 'http'" in problem
    assert f"hostname {http.inputs['spec']['hostnames'][0]!r}" in problem
    assert "GRPCRoute" in problem and "HTTPRoute" in problem


def test_routes_without_hostnames_claim_every_host() -> None:
    run, routes = _broken("dev-us-west-2", _kind("Route", "v4"))
    for route in routes:
        del route.inputs["spec"]["hostnames"]
    (problem,) = CHECKS["route hostnames"](run)
    assert "hostname '*'" in problem


def test_a_route_to_a_missing_service_or_port_fails() -> None:
    run, (route,) = _broken("prod-us-east-1", _kind("HTTPRoute", "catalog-ranker-8b-v3"))
    (backend,) = route.inputs["spec"]["rules"][0]["backendRefs"]
    backend["port"] = 8081
    (problem,) = CHECKS["route backends"](run)
    assert "has no port 8081" in problem and "catalog-ranker-8b-v3" in problem
    backend["name"] = "catalog-ranker-8b-v2"
    (problem,) = CHECKS["route backends"](run)
    assert "Service llm-serving/catalog-ranker-8b-v2 is not in the plan" in problem


def test_a_claim_that_binds_no_volume_fails() -> None:
    run, claims = _broken("dev-us-west-2", _kind("PersistentVolumeClaim", "read-only"))
    (claim,) = claims
    claim.inputs["spec"]["volumeName"] = "gone"
    (problem,) = CHECKS["claims bind"](run)
    assert "volumeName 'gone' names no PersistentVolume" in problem
    run, (claim,) = _broken("dev-us-west-2", _kind("PersistentVolumeClaim", "read-only"))
    del claim.inputs["spec"]["storageClassName"]
    claim.inputs["spec"]["resources"]["requests"]["storage"] = "4800Gi"
    problems = CHECKS["claims bind"](run)
    assert len(problems) == 2
    assert "the default class" in problems[0] and "4800Gi" in problems[1]


def test_a_pod_mounting_a_claim_outside_the_plan_fails() -> None:
    run, claims = _broken("prod-eu-west-1", _kind("PersistentVolumeClaim", "read-only"))
    run.resources.remove(claims[0])
    problems = CHECKS["claims bind"](run)
    assert problems and all("which is not in the plan" in p for p in problems)


def test_an_irsa_annotation_without_its_role_fails() -> None:
    run, roles = _broken("prod-us-east-1", _kind("iam/role:Role", "catalog-ranker-8b-v4-role"))
    run.resources.remove(roles[0])
    (problem,) = CHECKS["IRSA roles"](run)
    assert "catalog-ranker-8b-v4" in problem and "names no IAM role in the plan" in problem


def test_a_role_that_trusts_another_service_account_fails() -> None:
    # prod-eu-west-1 adopts its cluster: the OIDC issuer, so the trust policy, is known.
    run, (role,) = _broken("prod-eu-west-1", _kind("iam/role:Role", "catalog-ranker-8b-v4-role"))
    policy = role.inputs["assumeRolePolicy"]
    role.inputs["assumeRolePolicy"] = policy.replace(":catalog-ranker-8b-v4", ":other")
    (problem,) = CHECKS["IRSA roles"](run)
    assert "does not trust system:serviceaccount:llm-serving:catalog-ranker-8b-v4" in problem


def test_a_gpu_pod_that_does_not_tolerate_its_taint_fails() -> None:
    run, (rollout,) = _broken("prod-eu-west-1", _kind(":Rollout", "llama"))
    rollout.inputs["spec"]["template"]["spec"]["tolerations"] = []
    (problem,) = CHECKS["pods fit their node group"](run)
    assert "does not tolerate the taint" in problem and "nvidia.com/gpu" in problem


def test_a_gpu_pod_that_does_not_fit_an_instance_type_fails() -> None:
    # The shipped prod-ap-northeast-1 before the fix: g6.xlarge in l4-spot.
    run, (group,) = _broken("prod-ap-northeast-1", _kind("nodeGroup:NodeGroup", "l4-spot"))
    group.inputs["instanceTypes"] = ["g6.xlarge", *group.inputs["instanceTypes"]]
    (problem,) = CHECKS["pods fit their node group"](run)
    assert "catalog-ranker-8b-v4" in problem and "does not fit g6.xlarge (cpu, memory" in problem


def test_a_gpu_pod_without_its_node_group_fails() -> None:
    run, (group,) = _broken("dev-us-west-2", _kind("nodeGroup:NodeGroup", "l4-spot"))
    run.resources.remove(group)
    problems = CHECKS["pods fit their node group"](run)
    assert problems and all("no node group of the plan has labels" in p for p in problems)


def test_a_label_the_api_server_refuses_fails() -> None:
    # Custom resources are checked only by shape offline, and the built-in schemas type a
    # label value as any string: a value ending in '_' (a version like v5_) passed both.
    run, picked = _broken(
        "dev-us-west-2", lambda r: r.name.endswith(("-v4-grpcroute", "-v4-deployment"))
    )
    deployment, route = sorted(picked, key=lambda r: r.type)  # apps/v1 before gateway.*
    route.inputs["metadata"]["labels"]["llm-serving/model-version"] = "v5_"
    deployment.inputs["spec"]["selector"]["matchLabels"]["bad key/x"] = "ok"
    problems = sorted(CHECKS["label syntax"](run))
    assert len(problems) == 2, problems
    assert problems[0].startswith("Deployment llm-serving/catalog-ranker-8b-v4: spec.selector")
    assert "label key 'bad key/x' is not a qualified name" in problems[0]
    assert problems[1].startswith("GRPCRoute llm-serving/")
    assert "metadata.labels: label llm-serving/model-version='v5_' is not a valid" in problems[1]
