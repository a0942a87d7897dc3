"""ModelService: the pod template (contract 5), its resources, IRSA, scaling and ordering."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest

from components.cpu_node_group import cpu_tolerations
from components.gpu_node_group import GPU_RESOURCE, gpu_tolerations, node_selector
from components.model_service import (
    ModelService,
    ModelServiceArgs,
    RolloutWorkload,
    build_pod_template,
)
from components.model_service import args as pod
from components.model_service.args import ScalingTrigger, serving_mode_from_manifest
from components.model_service.pod import pod_selector
from runtime.entrypoint.settings import EntrypointSettings
from runtime.frontend.settings import FrontendSettings
from stacks.kubernetes_objects import validate_object
from tests.components.declared import Declare, Declared


def _args(**overrides: Any) -> ModelServiceArgs:
    values: dict[str, Any] = {
        "model_id": "llama",
        "version": "v2",
        "namespace": "serving",
        "image": "repo/serving:1",
        "serving_mode": "embedded",
        "bucket_name": "models-use1",
        "oidc_provider_arn": "arn:aws:iam::1:oidc-provider/oidc.example/id/X",
        "oidc_issuer": "oidc.example/id/X",
        "cache_claim_name": "cache-read-only",
        "node_group": "h100",
        "gpus": 4,
        "cpu": 32,
        "memory_gib": 256,
        "startup_timeout_s": 1500,
        "max_replicas": 3,
        "replicas": 1,
    }
    values.update(overrides)
    return ModelServiceArgs(**values)


def _containers(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in template["spec"]["containers"]}


def test_pod_template_is_plain_and_follows_contract_5() -> None:
    template = build_pod_template(_args(image="repo/serving:1"))
    serving = _containers(template)["triton"]
    ports = {p["name"]: p["containerPort"] for p in serving["ports"]}
    assert ports == {"grpc": 8001, "openai": 8080, "health": 8081}
    env = {e["name"]: e["value"] for e in serving["env"]}
    assert env["LLM_SERVING_PACKAGE_PATH"] == "/mnt/model-cache/models/llama/v2"
    assert env["LLM_SERVING_MODEL_ID"] == "llama"
    assert env["LLM_SERVING_MODEL_VERSION"] == "v2"
    assert env["LLM_SERVING_COLOUR"] == "stable"
    assert env["PROMETHEUS_MULTIPROC_DIR"] == pod.MULTIPROC_DIR == "/var/run/llm-serving/prometheus"
    assert env["LLM_SERVING_WORK_DIR"] == pod.SCRATCH_DIR
    assert {"name": "scratch", "mountPath": pod.SCRATCH_DIR} in serving["volumeMounts"]
    assert isinstance(env["LLM_SERVING_PACKAGE_S3_URI"], pulumi.Output)
    mounts = {m["name"]: m for m in serving["volumeMounts"]}
    assert mounts["model-cache"] == {
        "name": "model-cache",
        "mountPath": "/mnt/model-cache",
        "readOnly": True,
    }
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {
        "claimName": "cache-read-only",
        "readOnly": True,
    }
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"


def test_serving_pair_is_annotated_when_known() -> None:
    assert build_pod_template(_args())["metadata"]["annotations"] == {}
    template = build_pod_template(_args(triton_release="26.08", vllm_version="0.27.1"))
    assert template["metadata"]["annotations"] == {
        "llm-serving/triton-release": "26.08",
        "llm-serving/vllm-version": "0.27.1",
    }


def test_gpu_requests_equal_limits_and_pods_land_on_gpu_nodes() -> None:
    template = build_pod_template(_args())
    for container in template["spec"]["containers"]:
        assert container["resources"]["requests"] == container["resources"]["limits"]
    serving = _containers(template)["triton"]
    assert serving["resources"]["limits"][GPU_RESOURCE] == "4"
    assert template["spec"]["tolerations"] == gpu_tolerations()
    assert template["spec"]["nodeSelector"] == node_selector("h100")


def test_a_cpu_model_requests_no_gpu_and_tolerates_only_the_cpu_model_taint() -> None:
    template = build_pod_template(_args(gpus=0, cpu=2, memory_gib=4, node_group="r-cpu"))
    for container in template["spec"]["containers"]:
        assert GPU_RESOURCE not in container["resources"]["requests"]
        assert GPU_RESOURCE not in container["resources"]["limits"]
    serving = _containers(template)["triton"]
    assert serving["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert template["spec"]["tolerations"] == cpu_tolerations()
    assert all(t["key"] != GPU_RESOURCE for t in template["spec"]["tolerations"])
    assert template["spec"]["nodeSelector"] == node_selector("r-cpu")


def test_probes_are_sized_for_a_gpu_cold_start() -> None:
    serving = _containers(build_pod_template(_args(startup_timeout_s=1500)))["triton"]
    startup = serving["startupProbe"]
    assert startup["httpGet"] == {"path": "/readyz", "port": pod.HEALTH_PORT}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1500
    assert serving["readinessProbe"]["grpc"] == {"port": pod.GRPC_PORT}
    liveness = serving["livenessProbe"]
    assert liveness["httpGet"] == {"path": "/livez", "port": pod.HEALTH_PORT}
    # Liveness alone would kill a pod within a minute; only the startup probe covers loading.
    assert liveness["periodSeconds"] * liveness["failureThreshold"] < 60


def test_sidecar_shares_the_multiprocess_volume() -> None:
    template = build_pod_template(_args())
    containers = _containers(template)
    proxy, serving = containers["metrics-proxy"], containers["triton"]

    def multiproc_volume(container: dict[str, Any]) -> str:
        return next(
            m["name"] for m in container["volumeMounts"] if m["mountPath"] == pod.MULTIPROC_DIR
        )

    assert multiproc_volume(proxy) == multiproc_volume(serving)
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == multiproc_volume(proxy))
    assert "emptyDir" in volume
    env = {e["name"]: e["value"] for e in proxy["env"]}
    assert env["PROMETHEUS_MULTIPROC_DIR"] == pod.MULTIPROC_DIR
    assert env["LLM_SERVING_MODEL_VERSION"] == "v2"
    assert proxy["ports"] == [{"name": "metrics", "containerPort": pod.METRICS_PORT}]
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": pod.METRICS_PORT}


@pytest.fixture
def declared(declare: Declare) -> Declared:
    def program() -> None:
        job = k8s.batch.v1.Job(
            "materialize", metadata={"name": "materialize"}, spec={"template": {}}
        )
        ModelService("llama-v2", _args(depends_on=[job]))

    return declare(program)


def test_deployment_waits_for_the_materialize_job(declared: Declared) -> None:
    job = declared.one("kubernetes:batch/v1:Job")
    deployment = declared.one("kubernetes:apps/v1:Deployment")
    assert job.urn in deployment.dependencies
    template = deployment.inputs["spec"]["template"]
    assert deployment.inputs["spec"]["selector"]["matchLabels"].items() <= (
        template["metadata"]["labels"].items()
    )


def test_selector_survives_a_version_change() -> None:
    # Red-Black keeps one workload per model: a new version must not touch its selector.
    old, new = _args(service_name="llama"), _args(service_name="llama", version="v3")
    assert pod_selector(old) == pod_selector(new)
    assert old.labels["llm-serving/model-version"] != new.labels["llm-serving/model-version"]
    assert pod_selector(_args()) != pod_selector(_args(version="v3"))


def test_irsa_role_reads_only_its_model_prefix(declared: Declared) -> None:
    role = declared.one("aws:iam/role:Role")
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Condition"]["StringEquals"] == {
        "oidc.example/id/X:sub": "system:serviceaccount:serving:llama-v2",
        "oidc.example/id/X:aud": "sts.amazonaws.com",
    }
    policy = json.loads(declared.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    resources = [r for s in policy["Statement"] for r in s["Resource"]]
    assert resources == ["arn:aws:s3:::models-use1/models/llama/v2/*", "arn:aws:s3:::models-use1"]
    listing = next(s for s in policy["Statement"] if s["Action"] == ["s3:ListBucket"])
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["models/llama/v2/*"]}}
    assert all("*" not in a for s in policy["Statement"] for a in s["Action"])
    account = declared.one("kubernetes:core/v1:ServiceAccount").inputs
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == (
        f"arn:aws:mock:::{role.name}"
    )


def test_service_pdb_scrape_config_and_scaler(declared: Declared) -> None:
    service = declared.one("kubernetes:core/v1:Service").inputs
    assert [p["port"] for p in service["spec"]["ports"]] == [8001, 8080, 9400]
    pdb = declared.one("kubernetes:policy/v1:PodDisruptionBudget").inputs
    assert pdb["spec"]["maxUnavailable"] == 1
    monitor = declared.one("kubernetes:monitoring.coreos.com/v1:ServiceMonitor").inputs
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    scaler = declared.one("kubernetes:keda.sh/v1alpha1:ScaledObject").inputs["spec"]
    assert scaler["scaleTargetRef"]["name"] == "llama-v2"
    assert (scaler["minReplicaCount"], scaler["maxReplicaCount"]) == (1, 3)
    query = scaler["triggers"][0]["metadata"]["query"]
    assert query == 'sum(vllm:num_requests_waiting{model_id="llama",model_version="v2"})'


def test_rendered_objects_validate(declared: Declared) -> None:
    checked = {}
    for resource in declared.run.resources:
        if resource.type.startswith("kubernetes:"):
            has_schema, error = validate_object(resource.inputs)
            assert error is None, (resource.name, error)
            checked[resource.inputs["kind"]] = has_schema
    assert checked["Deployment"] is checked["Service"] is checked["PodDisruptionBudget"] is True
    assert checked["ScaledObject"] is checked["ServiceMonitor"] is False


def test_standalone_mode_has_no_openai_port(declare: Declare) -> None:
    declared = declare(lambda: ModelService("s", _args(serving_mode="standalone")))
    service = declared.one("kubernetes:core/v1:Service").inputs
    assert [p["name"] for p in service["spec"]["ports"]] == ["grpc", "metrics"]


def test_no_scaler_without_max_replicas(declare: Declare) -> None:
    declared = declare(lambda: ModelService("s", _args(max_replicas=None)))
    assert declared.of_type("kubernetes:keda.sh/v1alpha1:ScaledObject") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"serving_mode": "embedded"}', "embedded"),
        ('{"format_version": 1, "serving_mode": "standalone"}', "standalone"),
    ],
)
def test_serving_mode_comes_from_the_manifest(text: str, expected: str) -> None:
    assert serving_mode_from_manifest(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"serving_mode": "grpc"}', "expected one of: standalone, embedded"),
        ("{", "not valid"),
        ("{}", "missing serving_mode"),
        ("[]", "missing serving_mode"),
    ],
)
def test_bad_manifest_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        serving_mode_from_manifest(text)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gpus": -1}, r"gpus must be 0 \(a CPU model\) or more"),
        ({"scaling": ScalingTrigger("queue_depth", 8)}, "expected one of: queue_size, queue_time"),
        ({"scaling": ScalingTrigger("inference_rate", 0)}, "scaling target must be at least 1"),
        ({"max_replicas": 1, "replicas": 2}, "must be at least replicas"),
        ({"serving_mode": "both"}, "expected one of: standalone, embedded"),
        ({"startup_timeout_s": 5}, "startup_timeout_s must be at least 60"),
    ],
)
def test_bad_args_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_pod_template(_args(**overrides))


def test_a_rollout_brings_workload_and_services(declare: Declare) -> None:
    declared = declare(
        lambda: ModelService(
            "s",
            _args(service_name="llama", rollout=RolloutWorkload()),
        )
    )
    types = {r.type.rsplit(":", 1)[-1] for r in declared.run.resources}
    assert {"Deployment", "Service", "ServiceMonitor"}.isdisjoint(types)
    assert {"ServiceAccount", "PodDisruptionBudget", "PodMonitor", "ScaledObject"} <= types
    # Every pod scraped once, whatever Service (stable, canary) currently selects it.
    monitor = declared.one("kubernetes:monitoring.coreos.com/v1:PodMonitor").inputs["spec"]
    assert monitor["selector"]["matchLabels"] == pod_selector(_args(service_name="llama"))
    assert monitor["podMetricsEndpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s"}
    ]
    scaler = declared.one("kubernetes:keda.sh/v1alpha1:ScaledObject").inputs["spec"]
    assert scaler["scaleTargetRef"] == {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "name": "llama",
    }
    assert scaler["triggers"][0]["metadata"]["query"] == (
        'sum(vllm:num_requests_waiting{model_id="llama"})'
    )


def test_strategy_label_and_service_annotations(declare: Declare) -> None:
    annotations = {"llm-serving/created-at": "2026-09-20", "llm-serving/newest": "false"}
    declared = declare(
        lambda: ModelService("s", _args(strategy="versioned", service_annotations=annotations))
    )
    service = declared.one("kubernetes:core/v1:Service").inputs["metadata"]
    assert service["annotations"] == annotations
    assert service["labels"]["llm-serving/strategy"] == "versioned"
    deployment = declared.one("kubernetes:apps/v1:Deployment").inputs["spec"]
    # The strategy labels the pods but never joins the (immutable) selector.
    assert "llm-serving/strategy" not in deployment["selector"]["matchLabels"]
    assert deployment["template"]["metadata"]["labels"]["llm-serving/strategy"] == "versioned"


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e["value"] for e in container["env"]}


def test_embedded_frontend_gets_what_the_entrypoint_does_not_pass() -> None:
    template = build_pod_template(_args(triton_release="26.08", api_keys_secret="llama-keys"))
    serving = _containers(template)["triton"]
    env = _env(serving)
    # The frontend's settings (LLM_SERVING_FRONTEND_*) that the entrypoint leaves unset.
    assert env["LLM_SERVING_FRONTEND_SERVED_MODEL_ID"] == "llama"
    assert (
        env["LLM_SERVING_FRONTEND_API_KEYS_FILE"] == f"{pod.API_KEYS_DIR}/{pod.API_KEYS_SECRET_KEY}"
    )
    # The entrypoint takes the release from the image config, and hands it to the frontend.
    assert env["LLM_SERVING_TRITON_RELEASE"] == "26.08"
    mount = next(m for m in serving["volumeMounts"] if m["name"] == "api-keys")
    assert mount == {"name": "api-keys", "mountPath": pod.API_KEYS_DIR, "readOnly": True}
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == "api-keys")
    assert volume["secret"]["secretName"] == "llama-keys"
    assert volume["secret"]["items"] == [
        {"key": pod.API_KEYS_SECRET_KEY, "path": pod.API_KEYS_SECRET_KEY}
    ]


def test_pod_env_names_are_settings_the_processes_read(monkeypatch: pytest.MonkeyPatch) -> None:
    template = build_pod_template(
        _args(triton_release="26.08", api_keys_secret="llama-keys", served_model_id="llama-chat")
    )
    env = _env(_containers(template)["triton"])
    for name in list(os.environ):
        if name.startswith("LLM_SERVING_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    # The entrypoint adds the manifest's max_model_len; the pod sets no length of its own.
    assert "LLM_SERVING_FRONTEND_MAX_MODEL_LEN" not in env
    monkeypatch.setenv("LLM_SERVING_FRONTEND_MAX_MODEL_LEN", "4096")
    frontend = FrontendSettings()
    assert frontend.model_id == "llama-chat" and frontend.max_model_len == 4096
    assert str(frontend.api_keys_file) == f"{pod.API_KEYS_DIR}/{pod.API_KEYS_SECRET_KEY}"
    entrypoint = EntrypointSettings()
    assert entrypoint.triton_release == "26.08"
    assert entrypoint.drain_seconds == 45
    assert entrypoint.model_id == "llama" and entrypoint.model_version == "v2"


def test_no_api_keys_secret_means_no_keys_file_and_no_volume() -> None:
    template = build_pod_template(_args())
    serving = _containers(template)["triton"]
    assert "LLM_SERVING_FRONTEND_API_KEYS_FILE" not in _env(serving)
    assert "LLM_SERVING_TRITON_RELEASE" not in _env(serving)  # the image's own variable then
    assert all(v["name"] != "api-keys" for v in template["spec"]["volumes"])
    assert all(m["name"] != "api-keys" for m in serving["volumeMounts"])


@pytest.mark.parametrize("drain", [1, 45, 300])
def test_drain_deadline_fits_inside_the_grace_period(drain: int) -> None:
    template = build_pod_template(_args(drain_seconds=drain))
    serving = _containers(template)["triton"]
    grace = template["spec"]["terminationGracePeriodSeconds"]
    prestop = int(serving["lifecycle"]["preStop"]["exec"]["command"][1])
    assert _env(serving)["LLM_SERVING_DRAIN_SECONDS"] == str(drain)
    # preStop, then the entrypoint stops the frontend and Triton in turn, each up to drain + 5 s.
    assert prestop + 2 * (drain + 5) < grace


def test_drain_below_one_second_is_refused() -> None:
    with pytest.raises(ValueError, match="drain_seconds must be at least 1, got 0"):
        build_pod_template(_args(drain_seconds=0))


def test_sidecar_runs_the_interpreter_the_serving_image_starts_with() -> None:
    # The image's base (Ubuntu, NGC) guarantees python3 only; its ENTRYPOINT names it.
    dockerfile = (Path(__file__).resolve().parents[2] / "images/serving/Dockerfile").read_text()
    entrypoint = next(line for line in dockerfile.splitlines() if line.startswith("ENTRYPOINT"))
    interpreter = json.loads(entrypoint.removeprefix("ENTRYPOINT"))[1]
    assert _containers(build_pod_template(_args()))["metrics-proxy"]["command"][0] == interpreter
