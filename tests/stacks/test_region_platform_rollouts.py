"""RegionPlatform wiring of the two rollout strategies, under Pulumi's mocks with the
``prod-us-east-1`` configuration: a Red-Black model becomes one Argo Rollout around ModelService's
pod template, a Versioned model one ModelService per version behind a VersionedModel's routes."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pulumi

from stacks.config import ModelConfig, RegionStackConfig, load_stack_config
from stacks.kubernetes_objects import kubernetes_objects, validate_object
from stacks.mock_engine import ProgramRun, RecordedResource, auto_name, run_program
from stacks.region_platform import RegionPlatform, RegionPlatformArgs
from tests.components.declared import KnownOutputMocks

ROLLOUT = "kubernetes:argoproj.io/v1alpha1:Rollout"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
JOB = "kubernetes:batch/v1:Job"
SCALER = "kubernetes:keda.sh/v1alpha1:ScaledObject"
LLAMA = "llama-3-1-70b-instruct"
RANKER = "catalog-ranker-8b"


def _config() -> RegionStackConfig:
    config = load_stack_config("prod-us-east-1")
    assert isinstance(config, RegionStackConfig)
    return config


def _run_platform(config: RegionStackConfig) -> ProgramRun:
    def program() -> None:
        platform = RegionPlatform(
            "r",
            RegionPlatformArgs(
                config=config, image_repository_url="repo", bucket_name="b", vllm_version="0.27.1"
            ),
        )
        pulumi.export("endpoints", platform.endpoints)

    return run_program(program, "test", {}, KnownOutputMocks({}), preview=False)


@cache
def _prod() -> ProgramRun:
    return _run_platform(_config())


def _name(resource: RecordedResource) -> str:
    """``metadata.name``, or the one the provider gives an object declared without it."""
    return resource.inputs["metadata"].get("name") or auto_name(resource.name)


def _model(config: RegionStackConfig, model_id: str) -> ModelConfig:
    return next(m for m in config.models if m.id == model_id)


def _of(run: ProgramRun, type_: str, model_id: str) -> list[RecordedResource]:
    def model_of(resource: RecordedResource) -> Any:
        template = resource.inputs.get("spec", {}).get("template", {})
        labels = (template.get("metadata") or resource.inputs.get("metadata") or {}).get("labels")
        return (labels or {}).get("llm-serving/model-id")

    return [r for r in run.resources if r.type == type_ and model_of(r) == model_id]


def test_red_black_model_is_one_rollout_and_no_deployment() -> None:
    run = _prod()
    (rollout,) = _of(run, ROLLOUT, LLAMA)
    assert _of(run, DEPLOYMENT, LLAMA) == []
    assert rollout.inputs["metadata"]["name"] == LLAMA
    template = rollout.inputs["spec"]["template"]
    env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
    assert env["LLM_SERVING_MODEL_VERSION"]["value"] == "2026-11-15"
    # The colour comes from the ReplicaSet's pod-template hash, not the static "stable".
    assert "fieldRef" in env["LLM_SERVING_COLOUR"]["valueFrom"]
    assert "llm-serving/colour" not in template["metadata"]["labels"]
    assert template["metadata"]["annotations"] == {
        "llm-serving/triton-release": "26.08",
        "llm-serving/vllm-version": "0.27.1",
    }
    # The analysis checks the new colour serves the last listed version and finds the stable
    # colour by its pod-template hash: after a finished rollout it serves that version too.
    analysis = rollout.inputs["spec"]["strategy"]["canary"]["steps"][1]["analysis"]
    args = {a["name"]: a.get("value") or a.get("valueFrom") for a in analysis["args"]}
    assert args["canary-version"] == "2026-11-15"
    assert args["stable-colour"] == {"podTemplateHashValue": "Stable"}
    assert "stable-version" not in args
    replicas = _model(_config(), LLAMA).replicas
    assert rollout.inputs["spec"]["replicas"] == replicas


def test_red_black_rollout_waits_for_its_materialize_job_and_service_account() -> None:
    run = _prod()
    (rollout,) = _of(run, ROLLOUT, LLAMA)
    (job,) = _of(run, JOB, LLAMA)
    assert job.inputs["metadata"]["labels"]["llm-serving/model-version"] == "2026-11-15"
    assert job.urn in rollout.dependencies
    # Depending on the ModelService component means depending on its children.
    service = next(r for r in run.resources if r.type.endswith("ModelService") and LLAMA in r.name)
    account = next(
        r for r in run.resources if r.type.endswith(":ServiceAccount") and r.parent == service.urn
    )
    assert account.urn in rollout.dependencies
    pod = rollout.inputs["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account.inputs["metadata"]["name"]


def test_keda_scales_the_rollout_across_both_colours() -> None:
    run = _prod()
    (rollout,) = _of(run, ROLLOUT, LLAMA)
    (scaler,) = [
        r for r in run.resources if r.type == SCALER and r.inputs["metadata"]["name"] == LLAMA
    ]
    assert scaler.inputs["spec"]["scaleTargetRef"] == {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "name": rollout.inputs["metadata"]["name"],
    }
    # Both colours are replicas of the Rollout: the queue is summed over every version.
    query = scaler.inputs["spec"]["triggers"][0]["metadata"]["query"]
    assert query == f'sum(vllm:num_requests_waiting{{model_id="{LLAMA}"}})'
    assert scaler.inputs["spec"]["maxReplicaCount"] == _model(_config(), LLAMA).max_replicas


def test_red_black_services_are_the_rollouts_and_its_pods_are_scraped_once() -> None:
    run = _prod()
    (rollout,) = _of(run, ROLLOUT, LLAMA)
    services = {_name(r): r for r in _of(run, SERVICE, LLAMA)}
    canary = rollout.inputs["spec"]["strategy"]["canary"]
    assert set(services) == {canary["stableService"], canary["canaryService"]}
    monitors = [
        r for r in run.resources if r.type.startswith("kubernetes:monitoring.coreos.com/v1:")
    ]
    llama = [m for m in monitors if m.inputs["metadata"]["name"] == LLAMA]
    assert [m.type.rsplit(":", 1)[-1] for m in llama] == ["PodMonitor"]
    selector = llama[0].inputs["spec"]["selector"]["matchLabels"]
    labels = rollout.inputs["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()


def test_red_black_routes_attach_to_the_addons_gateway_on_the_model_hostname() -> None:
    run, config = _prod(), _config()
    gateway = next(r for r in run.resources if r.type.endswith(":Gateway"))
    routes = [r for r in run.resources if r.type.endswith("Route") and LLAMA in r.name]
    assert sorted(r.type.rsplit(":", 1)[-1] for r in routes) == ["GRPCRoute", "HTTPRoute"]
    for route in routes:
        assert route.inputs["spec"]["parentRefs"] == [
            {
                "name": gateway.inputs["metadata"]["name"],
                "namespace": gateway.inputs["metadata"]["namespace"],
            }
        ]
        grpc = route.type.endswith(":GRPCRoute")
        host = f"{LLAMA}.grpc.{config.domain}" if grpc else f"{LLAMA}.{config.domain}"
        assert route.inputs["spec"]["hostnames"] == [host]
    (rollout,) = _of(run, ROLLOUT, LLAMA)
    routing = rollout.inputs["spec"]["strategy"]["canary"]["trafficRouting"]
    plugin = routing["plugins"]["argoproj-labs/gatewayAPI"]
    names = {r.type.rsplit(":", 1)[-1]: _name(r) for r in routes}
    assert (plugin["grpcRoute"], plugin["httpRoute"]) == (names["GRPCRoute"], names["HTTPRoute"])


def test_red_black_output_is_the_route_of_the_served_version() -> None:
    config = _config()
    urls = _prod().outputs["endpoints"][LLAMA]
    host = f"{LLAMA}.{config.domain}"
    assert list(urls) == ["2026-11-15"]
    assert urls["2026-11-15"]["grpc"] == f"{LLAMA}.grpc.{config.domain}:80"
    assert urls["2026-11-15"]["openai"] == f"http://{host}/v1"


def test_versioned_model_runs_every_version_with_its_own_service_and_routes() -> None:
    run, config = _prod(), _config()
    assert _of(run, ROLLOUT, RANKER) == []
    deployments = {
        r.inputs["spec"]["template"]["metadata"]["labels"]["llm-serving/model-version"]: r
        for r in _of(run, DEPLOYMENT, RANKER)
    }
    assert sorted(deployments) == ["v3", "v4"]
    services = {r.inputs["metadata"]["name"]: r.inputs for r in _of(run, SERVICE, RANKER)}
    assert sorted(services) == ["catalog-ranker-8b-v3", "catalog-ranker-8b-v4"]
    v3 = services["catalog-ranker-8b-v3"]["metadata"]
    assert v3["labels"]["llm-serving/strategy"] == "versioned"
    assert v3["annotations"] == {
        "llm-serving/newest": "false",
        "llm-serving/created-at": "2026-09-20",
        "llm-serving/route-weight": "10",
    }
    v4 = services["catalog-ranker-8b-v4"]["metadata"]
    assert v4["annotations"]["llm-serving/newest"] == "true"
    assert v4["annotations"]["llm-serving/route-weight"] == "90"
    for version in ("v3", "v4"):
        routes = [r for r in run.resources if r.type.endswith("Route") and f"-{version}-" in r.name]
        assert len(routes) == 2
        for route in routes:
            grpc = route.type.endswith(":GRPCRoute")
            domain = f"grpc.{config.domain}" if grpc else config.domain
            assert route.inputs["spec"]["hostnames"] == [f"{version}.{RANKER}.{domain}"]
            (backend,) = route.inputs["spec"]["rules"][0]["backendRefs"]
            assert backend["name"] == f"{RANKER}-{version}"
    shared = next(r for r in run.resources if r.name.endswith(f"{RANKER}-shared-httproute"))
    weights = {b["name"]: b["weight"] for b in shared.inputs["spec"]["rules"][0]["backendRefs"]}
    assert weights == {"catalog-ranker-8b-v3": 10, "catalog-ranker-8b-v4": 90}
    urls = run.outputs["endpoints"][RANKER]
    assert sorted(urls) == ["v3", "v4"]
    assert urls["v3"]["grpc"] == f"v3.{RANKER}.grpc.{config.domain}:80"
    assert urls["v3"]["metrics"] == "http://catalog-ranker-8b-v3.llm-serving.svc:9400/metrics"


def test_removing_a_version_removes_exactly_its_resources() -> None:
    config = _config()
    ranker = _model(config, RANKER)
    v4 = ranker.versions[1].model_copy(update={"route_weight": 100})
    fewer = config.model_copy(
        update={
            "models": [
                m if m.id != RANKER else ranker.model_copy(update={"versions": [v4]})
                for m in config.models
            ]
        }
    )
    before = {r.urn: r for r in _prod().resources}
    after = {r.urn for r in _run_platform(fewer).resources}
    assert after < before.keys()
    removed = before.keys() - after
    version_specific = {urn for urn, r in before.items() if f"{RANKER}-v3" in r.name}
    assert removed == version_specific
    kinds = sorted(before[u].type.rsplit(":", 1)[-1] for u in removed)
    assert kinds == [
        "BackendTrafficPolicy",
        "Deployment",
        "GRPCRoute",
        "HTTPRoute",
        "Job",
        "ModelService",
        "PodDisruptionBudget",
        "Role",
        "RolePolicy",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]


def test_rollout_pod_template_validates_as_a_pod_template() -> None:
    run = _prod()
    for rollout in [r for r in run.resources if r.type == ROLLOUT]:
        spec = rollout.inputs["spec"]
        # The Rollout's CRD has no schema offline; its template is a core PodTemplateSpec.
        as_deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": rollout.inputs["metadata"]["name"]},
            "spec": {"selector": spec["selector"], "template": spec["template"]},
        }
        assert validate_object(as_deployment) == (True, None)
    checked = [validate_object(m) for _, m in kubernetes_objects(run)]
    assert [c for c in checked if c[1] is not None] == []


def test_red_black_role_reads_the_served_and_the_previous_version_only() -> None:
    run = _prod()
    (policy,) = [
        json.loads(r.inputs["policy"])
        for r in run.resources
        if r.type == "aws:iam/rolePolicy:RolePolicy" and LLAMA in r.name
    ]
    objects = next(s for s in policy["Statement"] if s["Action"] == ["s3:GetObject"])
    assert sorted(objects["Resource"]) == [
        f"arn:aws:s3:::b/models/{LLAMA}/2026-10-01/*",
        f"arn:aws:s3:::b/models/{LLAMA}/2026-11-15/*",
    ]
