"""The real stack program, run for every shipped stack under the mock engine (as the plan does)."""

from __future__ import annotations

from typing import Any

import pytest

from components.cpu_node_group import CPU_MODELS_ROLE
from components.gpu_node_group import NODE_GROUP_LABEL
from contracts.labels import NODE_ROLE_LABEL
from runtime.compat import load_matrix
from stacks.config import RegionStackConfig
from stacks.kubernetes_objects import kubernetes_objects, validate_object
from tests.support.stack_plans import REGION_STACKS, region_config, stack_plan

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
ROLLOUT = "kubernetes:argoproj.io/v1alpha1:Rollout"
_EFFECTS = {"NO_SCHEDULE": "NoSchedule"}


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_outputs_give_every_served_version_its_endpoints(stack: str) -> None:
    config, run = region_config(stack), stack_plan(stack)
    endpoints = run.outputs["endpoints"]
    assert sorted(endpoints) == sorted(m.id for m in config.models)
    for model in config.models:
        served = [v.version for v in model.served_versions]
        assert sorted(endpoints[model.id]) == sorted(served)
        for version in served:
            # Red-Black: one hostname pair per model; Versioned: one per version (and the
            # shared one). gRPC hostnames live under grpc.<domain>, OpenAI ones under <domain>.
            label = model.id if model.strategy == "red-black" else f"{version}.{model.id}"
            host = f"{label}.{config.domain}"
            urls = endpoints[model.id][version]
            assert urls["grpc"] == f"{label}.grpc.{config.domain}:80"
            assert urls["openai"] == f"http://{host}/v1"
            assert urls["metrics"].startswith("http://")
            assert urls["metrics"].endswith(f".{config.namespace}.svc:9400/metrics")
    assert run.outputs["cluster_name"] == config.cluster.name


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_every_kubernetes_object_validates(stack: str) -> None:
    objects = list(kubernetes_objects(stack_plan(stack)))
    version = region_config(stack).cluster.version
    results = [(m["kind"], *validate_object(m, version)) for _, m in objects]
    assert [r for r in results if r[2] is not None] == []
    kinds_with_schema = {kind for kind, has_schema, _ in results if has_schema}
    assert {"Deployment", "Job", "Service", "PersistentVolume", "PodDisruptionBudget"} <= (
        kinds_with_schema
    )


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_servers_fit_their_node_group_and_wait_for_their_job(stack: str) -> None:
    run = stack_plan(stack)
    groups = {
        r.inputs["labels"][NODE_GROUP_LABEL]: r.inputs
        for r in run.resources
        if r.type == "aws:eks/nodeGroup:NodeGroup" and NODE_GROUP_LABEL in r.inputs["labels"]
    }
    jobs = {
        (
            r.inputs["metadata"]["labels"]["llm-serving/model-id"],
            r.inputs["metadata"]["labels"]["llm-serving/model-version"],
        ): r.urn
        for r in run.resources
        if r.type == "kubernetes:batch/v1:Job"
        and r.inputs["metadata"]["labels"].get("app.kubernetes.io/name") == "model-materialize"
    }
    deployments = [r for r in run.resources if r.type in (DEPLOYMENT, ROLLOUT)]
    assert deployments
    for deployment in deployments:
        pod = deployment.inputs["spec"]["template"]
        group = groups[pod["spec"]["nodeSelector"][NODE_GROUP_LABEL]]
        for taint in group["taints"]:
            assert {
                "key": taint["key"],
                "operator": "Exists",
                "effect": _EFFECTS[taint["effect"]],
            } in (pod["spec"]["tolerations"])
        labels = pod["metadata"]["labels"]
        key = (labels["llm-serving/model-id"], labels["llm-serving/model-version"])
        assert jobs[key] in deployment.dependencies
    # Children do not inherit their component's dependencies: check the ones that matter.
    namespace = next(r.urn for r in run.resources if r.type == "kubernetes:core/v1:Namespace")
    csi = next(r.urn for r in run.resources if r.name.endswith("aws-fsx-csi-driver"))
    direct = {r.urn: set(r.dependencies) for r in run.resources}

    def waits_for(urn: str) -> set[str]:
        seen: set[str] = set()
        todo = list(direct[urn])
        while todo:
            item = todo.pop()
            if item not in seen:
                seen.add(item)
                todo.extend(direct.get(item, ()))
        return seen

    for resource in run.resources:
        metadata = resource.inputs.get("metadata", {})
        if resource.type.startswith("kubernetes:") and metadata.get("namespace"):
            assert namespace in waits_for(resource.urn), resource.name
        if resource.type == "kubernetes:batch/v1:Job":
            assert csi in resource.dependencies


def test_red_black_serves_only_the_last_version() -> None:
    run = stack_plan("prod-us-east-1")
    served = {
        (
            d.type,
            d.inputs["spec"]["template"]["metadata"]["labels"]["llm-serving/model-id"],
            d.inputs["spec"]["template"]["metadata"]["labels"]["llm-serving/model-version"],
        )
        for d in run.resources
        if d.type in (DEPLOYMENT, ROLLOUT)
    }
    assert served == {
        (ROLLOUT, "llama-3-1-70b-instruct", "2026-11-15"),
        (DEPLOYMENT, "catalog-ranker-8b", "v3"),
        (DEPLOYMENT, "catalog-ranker-8b", "v4"),
    }


def test_adopting_a_cluster_creates_none() -> None:
    adopted = {r.type for r in stack_plan("prod-eu-west-1").resources}
    created = {r.type for r in stack_plan("prod-us-east-1").resources}
    assert "aws:eks/cluster:Cluster" not in adopted
    assert "aws:iam/openIdConnectProvider:OpenIdConnectProvider" not in adopted
    assert "aws:eks/cluster:Cluster" in created
    assert "aws:eks/nodeGroup:NodeGroup" in adopted


def test_region_stacks_read_the_global_stack() -> None:
    run = stack_plan("dev-us-west-2")
    reference = next(r for r in run.resources if r.type == "pulumi:pulumi:StackReference")
    assert reference.name == "llm-serving/global"
    deployment = next(r for r in run.resources if r.type == "kubernetes:apps/v1:Deployment")
    image = deployment.inputs["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.startswith("123456789012.dkr.ecr.us-west-2.amazonaws.com/")
    assert image.endswith(":0.1.0-dev-triton26.08")
    annotations = deployment.inputs["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "llm-serving/triton-release": "26.08",
        "llm-serving/vllm-version": load_matrix().for_triton("26.08").vllm,
    }


def test_global_stack_exports_what_regions_read() -> None:
    run = stack_plan("global")
    regions = {"us-east-1", "eu-west-1", "ap-northeast-1", "us-west-2"}
    assert set(run.outputs["image_repository_urls"]) == regions
    assert set(run.outputs["model_buckets"]) == regions
    types = {r.type for r in run.resources}
    assert "aws:ecr/replicationConfiguration:ReplicationConfiguration" in types
    assert "aws:s3/bucketReplicationConfig:BucketReplicationConfig" in types


def _served_by(config: RegionStackConfig) -> dict[str, str]:
    from stacks.mock_engine import run_program
    from stacks.region_platform import RegionPlatform, RegionPlatformArgs
    from tests.components.declared import KnownOutputMocks

    def program() -> None:
        RegionPlatform(
            "r", RegionPlatformArgs(config=config, image_repository_url="repo", bucket_name="b")
        )

    run = run_program(program, "test", {}, KnownOutputMocks({}), preview=False)
    return {
        r.urn: r.inputs["spec"]["template"]["metadata"]["labels"]["llm-serving/model-version"]
        for r in run.resources
        if r.type in (DEPLOYMENT, ROLLOUT)
    }


def test_a_red_black_version_change_updates_the_same_resources() -> None:
    config = region_config("prod-us-east-1")
    llama = config.models[0]
    assert llama.strategy == "red-black"
    newer = llama.model_copy(
        update={
            "versions": [*llama.versions, llama.versions[0].model_copy(update={"version": "v9"})]
        }
    )
    before = _served_by(config)
    after = _served_by(config.model_copy(update={"models": [newer, *config.models[1:]]}))
    assert before.keys() == after.keys()
    (rollout,) = (urn for urn in before if urn.endswith(":Rollout::r-llama-3-1-70b-instruct"))
    assert (before[rollout], after[rollout]) == ("2026-11-15", "v9")


def test_metrics_assets_ship_once_per_region() -> None:
    from stacks.mock_engine import run_program
    from stacks.region_platform import RegionPlatform, RegionPlatformArgs
    from tests.components.declared import KnownOutputMocks

    dashboard = {"uid": "llm-serving", "panels": []}
    groups = [{"name": "llm-serving", "rules": [{"alert": "A", "expr": "vector(1) > 2"}]}]

    def program() -> None:
        RegionPlatform(
            "r",
            RegionPlatformArgs(
                config=region_config("prod-us-east-1"),
                image_repository_url="repo",
                bucket_name="b",
                dashboard=dashboard,
                alert_groups=groups,
            ),
        )

    run = run_program(program, "test", {}, KnownOutputMocks({}), preview=False)
    maps = [r for r in run.resources if r.type == "kubernetes:core/v1:ConfigMap"]
    rules = [r for r in run.resources if r.type.endswith(":PrometheusRule")]
    assert len(maps) == len(rules) == 1
    assert rules[0].inputs["spec"]["groups"] == groups
    # Waits for the Prometheus operator (its CRD) and the namespace, though it is no child of
    # the add-ons component: depending on a component means depending on its children.
    operator = next(
        r for r in run.resources if r.type.endswith(":Release") and "prometheus" in r.name
    )
    namespace = next(r for r in run.resources if r.type.endswith(":Namespace"))
    assert {operator.urn, namespace.urn} <= set(rules[0].dependencies)
    assert {operator.urn, namespace.urn} <= set(maps[0].dependencies)
    gateway = next(r for r in run.resources if r.type.endswith(":Gateway"))
    assert namespace.urn in gateway.dependencies


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_device_plugin_runs_exactly_where_the_ami_lacks_it(stack: str) -> None:
    run = stack_plan(stack)
    families = {
        r.inputs["labels"]["llm-serving/ami-family"]
        for r in run.resources
        if r.type == "aws:eks/nodeGroup:NodeGroup"
        and NODE_GROUP_LABEL in r.inputs["labels"]
        and r.inputs["labels"].get(NODE_ROLE_LABEL) != CPU_MODELS_ROLE
    }
    plugins = [
        r.inputs
        for r in run.resources
        if r.type == "kubernetes:helm.sh/v3:Release" and r.inputs["name"] == "nvidia-device-plugin"
    ]
    assert bool(plugins) == ("al2023" in families)
    for plugin in plugins:
        assert plugin["values"]["nodeSelector"] == {"llm-serving/ami-family": "al2023"}


CREATED_STACKS = [s for s in REGION_STACKS if region_config(s).cluster.mode == "create"]
_WORKLOADS = ("kubernetes:batch/v1:Job", DEPLOYMENT, ROLLOUT)


def _tolerates(tolerations: list[dict[str, str]], taint: dict[str, str]) -> bool:
    # Kubernetes' matching of a toleration to a taint that has no value.
    effect = _EFFECTS[taint["effect"]]
    return any(
        t.get("effect") in (None, "", effect)
        and (
            (t.get("operator") == "Exists" and t.get("key") in (None, "", taint["key"]))
            or (t.get("key") == taint["key"] and not t.get("value"))
        )
        for t in tolerations
    )


def _fits(pod: dict[str, Any], group: dict[str, Any]) -> bool:
    """Whether a pod spec (or a chart's values) may be scheduled on a node group's nodes."""
    labels = group.get("labels") or {}
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    required = (
        (pod.get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if required is not None and not any(
        all(
            e["operator"] == "In" and labels.get(e["key"]) in e["values"]
            for e in term["matchExpressions"]
        )
        for term in required["nodeSelectorTerms"]
    ):
        return False
    return all(_tolerates(pod.get("tolerations") or [], t) for t in group.get("taints") or [])


@pytest.mark.parametrize("stack", CREATED_STACKS)
def test_every_pod_of_a_created_cluster_has_a_node_group_it_fits(stack: str) -> None:
    run = stack_plan(stack)
    groups = [r.inputs for r in run.resources if r.type == "aws:eks/nodeGroup:NodeGroup"]
    assert any(not g.get("taints") for g in groups), "no untainted node group"
    pods = {
        f"{r.type} {r.name}": r.inputs["spec"]["template"]["spec"]
        for r in run.resources
        if r.type in _WORKLOADS
    }
    # Charts take top-level nodeSelector and tolerations for their pods (none set: any node).
    pods |= {
        f"release {r.name}": r.inputs.get("values") or {}
        for r in run.resources
        if r.type == "kubernetes:helm.sh/v3:Release"
    }
    assert any(name.startswith("kubernetes:batch/v1:Job") for name in pods)
    assert [name for name, pod in pods.items() if not any(_fits(pod, g) for g in groups)] == []


@pytest.mark.parametrize("stack", CREATED_STACKS)
def test_add_ons_and_workloads_wait_for_the_system_nodes(stack: str) -> None:
    run = stack_plan(stack)
    (system,) = (
        r
        for r in run.resources
        if r.type == "aws:eks/nodeGroup:NodeGroup" and not r.inputs.get("taints")
    )
    assert system.inputs["labels"] == {"llm-serving/node-role": "system"}
    releases = [r for r in run.resources if r.type == "kubernetes:helm.sh/v3:Release"]
    assert releases
    for release in releases:
        assert system.urn in release.dependencies, release.name
    for workload in (r for r in run.resources if r.type in (DEPLOYMENT, ROLLOUT)):
        assert system.urn in workload.dependencies, workload.name


def test_an_adopted_cluster_gets_no_system_nodes() -> None:
    types = {r.type for r in stack_plan("prod-eu-west-1").resources}
    assert "llm-serving:system_node_group:SystemNodeGroup" not in types
    created = {r.type for r in stack_plan("prod-us-east-1").resources}
    assert "llm-serving:system_node_group:SystemNodeGroup" in created


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_capacity_block_groups_launch_only_in_their_reservations_subnet(stack: str) -> None:
    config, run = region_config(stack), stack_plan(stack)
    groups = {
        r.name.removesuffix("-nodes"): r.inputs
        for r in run.resources
        if r.type == "aws:eks/nodeGroup:NodeGroup"
    }
    for group in config.node_groups:
        subnets = groups[f"{stack}-{group.name}"]["subnetIds"]
        if group.capacity_type == "CAPACITY_BLOCK":
            assert subnets == [group.subnet_id]
        else:
            assert subnets == config.network.private_subnet_ids


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_each_endpoint_is_the_hostname_of_its_own_route_kind(stack: str) -> None:
    # endpoints say which is which: grpc is a GRPCRoute's hostname, openai an HTTPRoute's.
    run = stack_plan(stack)
    hosts: dict[str, set[str]] = {"GRPCRoute": set(), "HTTPRoute": set()}
    for resource in run.resources:
        kind = resource.type.rsplit(":", 1)[-1]
        if kind in hosts:
            hosts[kind].update(resource.inputs["spec"]["hostnames"])
    assert not hosts["GRPCRoute"] & hosts["HTTPRoute"]
    for versions in run.outputs["endpoints"].values():
        for urls in versions.values():
            assert urls["grpc"].removesuffix(":80") in hosts["GRPCRoute"]
            assert urls["openai"].removeprefix("http://").removesuffix("/v1") in hosts["HTTPRoute"]
