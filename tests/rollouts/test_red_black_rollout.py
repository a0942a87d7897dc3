"""RedBlackRollout under Pulumi's mocks: the Rollout, its routes, services and analysis wiring."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pulumi
import pytest

from components.gateway import GATEWAY_PLUGIN, GatewayRef
from components.red_black import RedBlackConfigError, RedBlackRollout
from policy.workloads import (
    check_gpu_pods_tolerate_taint,
    check_images_pinned,
    check_red_black_steps,
)
from tests.rollouts.harness import deploy, make_args, run_under_mocks
from tests.rollouts.mocks import RecordingMocks
from tests.rollouts.samples import pod_template, queries, success_conditions

ROLLOUT = "kubernetes:argoproj.io/v1alpha1:Rollout"


@pytest.fixture
def mocks() -> RecordingMocks:
    return RecordingMocks()


def rollout_spec(mocks: RecordingMocks) -> dict[str, Any]:
    return mocks.one(":Rollout").inputs["spec"]


def test_declares_rollout_services_routes_and_templates(mocks: RecordingMocks) -> None:
    (job_name,) = deploy(mocks, make_args())
    assert job_name.startswith("llama-x1y2z3-status-")
    kinds = sorted(d.type.rsplit(":", 1)[-1] for d in mocks.declared)
    assert kinds == [
        "AnalysisTemplate",
        "AnalysisTemplate",
        "BackendTrafficPolicy",  # the GRPCRoute's bound (the HTTPRoute carries its own)
        "GRPCRoute",
        "HTTPRoute",
        "Job",
        "RedBlackRollout",
        "Role",
        "RoleBinding",
        "Rollout",
        "Service",
        "Service",
        "ServiceAccount",
    ]
    assert all(
        d.inputs.get("metadata", {}).get("namespace") in (None, "serving") for d in mocks.declared
    )


def test_canary_shifts_weights_with_an_analysis_after_each(mocks: RecordingMocks) -> None:
    deploy(mocks, make_args(steps=(5, 20, 100)))
    canary = rollout_spec(mocks)["strategy"]["canary"]
    assert canary["dynamicStableScale"] is True
    weights = [s["setWeight"] for s in canary["steps"] if "setWeight" in s]
    assert weights == [5, 20, 100]
    kinds = [next(iter(s)) for s in canary["steps"]]
    assert kinds == ["setWeight", "analysis"] * 3
    templates = {d.name: d.inputs["metadata"]["name"] for d in mocks.of_type(":AnalysisTemplate")}
    used = [{t["templateName"] for t in s["analysis"]["templates"]} for s in canary["steps"][1::2]]
    # While the stable colour takes traffic, the canary is also compared with it; at 100 it
    # takes none (and is scaled to 0), so only the canary's own bounds remain.
    assert used == [set(templates.values())] * 2 + [{templates["llama-canary"]}]


def test_rollout_aborts_on_deadline_and_pulumi_waits_for_argo_status(
    mocks: RecordingMocks,
) -> None:
    deploy(mocks, make_args(await_timeout_seconds=5400))
    declared = mocks.one(":Rollout").inputs
    assert declared["spec"]["progressDeadlineAbort"] is True
    # The Rollout itself is not awaited: its status may still describe the previous revision.
    assert declared["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert "pulumi.com/waitFor" not in declared["metadata"]["annotations"]

    job = mocks.one("batch/v1:Job").inputs
    assert job["metadata"]["annotations"]["pulumi.com/timeoutSeconds"] == str(5400 + 300)
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "quay.io/argoproj/kubectl-argo-rollouts:v1.7.2"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    rollout_name = declared["metadata"]["name"]
    assert container["args"] == [
        "status",
        rollout_name,
        "--namespace",
        "serving",
        "--timeout",
        "5400s",
    ]
    # The wait runs with a role that can only read.
    (role,) = [d.inputs for d in mocks.of_type("rbac.authorization.k8s.io/v1:Role")]
    assert {verb for rule in role["rules"] for verb in rule["verbs"]} == {"get", "list", "watch"}
    account = mocks.one("core/v1:ServiceAccount").inputs["metadata"]["name"]
    assert pod["serviceAccountName"] == account
    # No selector of the serving pods (Rollout, Services, PDB, PodMonitor) may match it.
    selector = declared["spec"]["selector"]["matchLabels"]
    job_labels = job["spec"]["template"]["metadata"]["labels"]
    assert not set(selector.items()) <= set(job_labels.items())
    kubernetes_validate.validate(
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}, "spec": job["spec"]},
        "1.33",
        strict=True,
    )


# What `kubectl argo rollouts status` watches before it starts its --timeout: the informers
# its view controller waits for (argo-rollouts pkg/kubectl-argo-rollouts/viewcontroller,
# cache.WaitForCacheSync), and the Deployments one that it starts with them.
STATUS_INFORMERS = [
    ("argoproj.io", "rollouts"),
    ("argoproj.io", "analysisruns"),
    ("argoproj.io", "experiments"),
    ("apps", "replicasets"),
    ("apps", "deployments"),
    ("", "pods"),
]


def test_status_role_lets_argo_sync_every_informer(mocks: RecordingMocks) -> None:
    deploy(mocks, make_args())
    (role,) = [d.inputs for d in mocks.of_type("rbac.authorization.k8s.io/v1:Role")]
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    for informer in STATUS_INFORMERS:
        assert granted.get(informer, set()) >= {"get", "list", "watch"}, informer
    assert set(granted) == set(STATUS_INFORMERS)
    body = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role"}
    body |= {"metadata": {"name": "status"}, "rules": role["rules"]}
    kubernetes_validate.validate(body, "1.33", strict=True)


def test_plugin_names_the_declared_routes_and_services(mocks: RecordingMocks) -> None:
    deploy(mocks, make_args())
    canary = rollout_spec(mocks)["strategy"]["canary"]
    plugin = canary["trafficRouting"]["plugins"][GATEWAY_PLUGIN]
    grpc, http = mocks.one(":GRPCRoute"), mocks.one(":HTTPRoute")
    assert plugin == {
        "grpcRoute": grpc.inputs["metadata"]["name"],
        "httpRoute": http.inputs["metadata"]["name"],
        "namespace": "serving",
    }
    services = {d.name: d.inputs["metadata"]["name"] for d in mocks.of_type(":Service")}
    assert canary["stableService"] == services["llama-stable"]
    assert canary["canaryService"] == services["llama-canary"]
    for route, port, host in (
        (grpc, 8001, "llama.grpc.models.example.com"),
        (http, 8080, "llama.models.example.com"),
    ):
        rule = route.inputs["spec"]["rules"][0]
        assert rule["backendRefs"] == [
            {"name": services["llama-stable"], "port": port, "weight": 100},
            {"name": services["llama-canary"], "port": port, "weight": 0},
        ]
        assert route.inputs["spec"]["hostnames"] == [host]
    assert grpc.inputs["spec"]["parentRefs"] == [
        {"name": "inference", "namespace": "gateway", "sectionName": "grpc"}
    ]
    assert http.inputs["spec"]["parentRefs"] == [{"name": "inference", "namespace": "gateway"}]


def test_services_select_the_rollout_pods(mocks: RecordingMocks) -> None:
    deploy(mocks, make_args())
    spec = rollout_spec(mocks)
    labels = spec["template"]["metadata"]["labels"]
    # The selector keeps only what no rollout changes: never the version or the colour.
    assert spec["selector"]["matchLabels"] == {
        "llm-serving/model-id": "llama",
        "llm-serving/strategy": "red-black",
    }
    assert labels["llm-serving/model-version"] == "2026-11-15"
    for service in mocks.of_type(":Service"):
        selector = service.inputs["spec"]["selector"]
        assert selector == spec["selector"]["matchLabels"]
        assert {p["port"] for p in service.inputs["spec"]["ports"]} == {8001, 8080, 9400}


def test_every_container_reads_its_colour_from_the_pod_hash(mocks: RecordingMocks) -> None:
    deploy(mocks, make_args())
    containers = rollout_spec(mocks)["template"]["spec"]["containers"]
    assert len(containers) == 2
    for container in containers:
        colour = [e for e in container["env"] if e["name"] == "LLM_SERVING_COLOUR"]
        assert colour == [
            {
                "name": "LLM_SERVING_COLOUR",
                "valueFrom": {
                    "fieldRef": {"fieldPath": "metadata.labels['rollouts-pod-template-hash']"}
                },
            }
        ]


def test_analysis_compares_canary_colour_with_stable_colour(mocks: RecordingMocks) -> None:
    deploy(mocks, make_args())
    step = rollout_spec(mocks)["strategy"]["canary"]["steps"][1]["analysis"]
    passed = {a["name"]: a for a in step["args"]}
    assert passed["canary-colour"]["valueFrom"] == {"podTemplateHashValue": "Latest"}
    assert passed["stable-colour"]["valueFrom"] == {"podTemplateHashValue": "Stable"}
    assert passed["canary-version"]["value"] == "2026-11-15"
    # The stable side is its colour: no version from the configuration can say what it serves.
    assert "stable-version" not in passed
    templates = {d.name: d.inputs["spec"] for d in mocks.of_type(":AnalysisTemplate")}
    assert set(templates) == {"llama-canary", "llama-vs-stable"}
    for name, spec in templates.items():
        declared = {a["name"] for a in spec["args"]}
        assert declared <= set(passed)
        against_stable = name.endswith("-vs-stable")
        assert [m["name"].endswith("-vs-stable") for m in spec["metrics"]] == [against_stable] * 2
        for metric in spec["metrics"]:
            query = metric["provider"]["prometheus"]["query"]
            assert metric["provider"]["prometheus"]["address"] == (
                "http://prometheus.monitoring:9090"
            )
            assert "{{args.colour}}" not in query and "{{args.model_version}}" not in query
            assert 'model_version="{{args.canary-version}}"' in query
            assert "{{args.canary-colour}}" in query
            assert ("{{args.stable-colour}}" in query) is against_stable


def test_rendered_rollout_passes_the_policy_pack(mocks: RecordingMocks) -> None:
    deploy(mocks, make_args())
    props = mocks.one(":Rollout").inputs
    assert check_red_black_steps(ROLLOUT, props) == []
    assert check_gpu_pods_tolerate_taint(ROLLOUT, props) == []
    assert check_images_pinned(ROLLOUT, props) == []


def test_each_revision_gets_its_own_status_job() -> None:
    first = deploy(RecordingMocks(), make_args())
    again = deploy(RecordingMocks(), make_args())
    assert first == again, "an unchanged stack must keep its finished Job"
    new_version = deploy(RecordingMocks(), make_args(version="2026-12-01"))
    template = pod_template()
    template["spec"]["containers"][0]["image"] = "registry.example.com/serving:2.0-triton26.08"
    new_image = deploy(RecordingMocks(), make_args(pod_template=template))
    assert len({*first, *new_version, *new_image}) == 3


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"steps": (10, 50)}, "must end at 100"),
        ({"steps": (50, 25, 100)}, "strictly increasing"),
        ({"queries": {"success_ratio": "up"}}, "ttft_p95"),
        ({"replicas": 0}, "replicas"),
        (
            {"queries": {"success_ratio": "up", "ttft_p95": 'x{model_version="${version}"}'}},
            "names the placeholder version",
        ),
        ({"queries": {"success_ratio": "up", "ttft_p95": 'x{a="$"}'}}, "malformed placeholder"),
        # One listener accepts only one of a GRPCRoute and an HTTPRoute claiming one hostname.
        (
            {"gateway": GatewayRef(name="g"), "grpc_hostnames": ("llama.models.example.com",)},
            "both claim llama.models.example.com",
        ),
        ({"gateway": GatewayRef(name="g"), "hostnames": (), "grpc_hostnames": ()}, "both claim"),
        # Argo refuses these analyses (count 0 runs indefinitely; count < failureLimit; Go
        # durations), and one whose failureLimit reaches its count never fails a canary.
        ({"analysis_count": 0}, "analysis_count is 0"),
        ({"analysis_count": 3, "failure_limit": 5}, "failure_limit is 5"),
        ({"analysis_count": 1, "failure_limit": 1}, "failure_limit is 1"),
        ({"failure_limit": -1}, "failure_limit is -1"),
        ({"analysis_interval": "1min"}, "analysis_interval is '1min'"),
        ({"initial_delay": "2 m"}, "initial_delay is '2 m'"),
        # A query the analysis does not know how to compare would be left out of it unseen.
        (
            {
                "queries": {**queries(), "itl_p95": "up"},
                "success_conditions": {**success_conditions(), "itl_p95": "result[0] < 1"},
            },
            "queries names itl_p95",
        ),
    ],
)
def test_bad_arguments_name_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(RedBlackConfigError, match=field):
        RedBlackRollout("bad", make_args(**overrides))


def test_endpoints_name_the_public_host_and_the_stable_metrics() -> None:
    mocks = RecordingMocks()
    (endpoints,) = run_under_mocks(mocks, lambda: RedBlackRollout("llama", make_args()).endpoints)
    assert endpoints == {
        "grpc": "llama.grpc.models.example.com:443",
        "openai": "https://llama.models.example.com/v1",
        "metrics": "http://llama-stable-x1y2z3.serving.svc:9400/metrics",
    }


def test_endpoints_through_a_plain_http_gateway() -> None:
    mocks = RecordingMocks()
    gateway = GatewayRef(name="llm-serving", namespace="serving", port=80, tls=False)
    (endpoints,) = run_under_mocks(
        mocks, lambda: RedBlackRollout("llama", make_args(gateway=gateway)).endpoints
    )
    assert endpoints["grpc"] == "llama.grpc.models.example.com:80"
    assert endpoints["openai"] == "http://llama.models.example.com/v1"
    assert GatewayRef(name="g", port=8443).http_url("h", "/v1") == "https://h:8443/v1"


def test_a_named_rollout_keeps_its_name(mocks: RecordingMocks) -> None:
    deploy(mocks, make_args(name="llama"))
    assert mocks.one(":Rollout").inputs["metadata"]["name"] == "llama"
    # Unnamed, the provider names it (the mocks add a suffix like the provider's).
    unnamed = RecordingMocks()
    deploy(unnamed, make_args())
    assert unnamed.one(":Rollout").inputs["metadata"]["name"] == "llama-x1y2z3"


def test_core_objects_validate_against_the_kubernetes_schema(mocks: RecordingMocks) -> None:
    deploy(mocks, make_args())
    for service in mocks.of_type(":Service"):
        body = {"apiVersion": "v1", "kind": "Service", **service.inputs}
        kubernetes_validate.validate(body, "1.33", strict=True)
    template = rollout_spec(mocks)["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **template["metadata"]}}
    kubernetes_validate.validate({**pod, "spec": template["spec"]}, "1.33", strict=True)


def test_pod_template_outputs_pass_through_unchanged() -> None:
    """build_pod_template puts Pulumi Outputs in env values (the S3 fallback URI)."""
    mocks = RecordingMocks()

    def build() -> pulumi.Output:
        template = pod_template()
        uri = pulumi.Output.concat("s3://", pulumi.Output.from_input("bucket"), "/models/llama/")
        template["spec"]["containers"][0]["env"].append(
            {"name": "LLM_SERVING_PACKAGE_S3_URI", "value": uri}
        )
        return RedBlackRollout("llama", make_args(pod_template=template)).status_job_name

    run_under_mocks(mocks, build)
    env = rollout_spec(mocks)["template"]["spec"]["containers"][0]["env"]
    assert {"name": "LLM_SERVING_PACKAGE_S3_URI", "value": "s3://bucket/models/llama/"} in env
