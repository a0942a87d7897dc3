"""The serving pod of one model version: ``ModelServiceArgs`` and ``build_pod_template``.

Ports, paths and environment follow contract 5 of the project: the entrypoint gates the public
KServe gRPC port 8001, serves ``/livez`` and ``/readyz`` on 8081, the embedded OpenAI frontend
listens on 8080, and the metrics-proxy sidecar serves 9400 from the multiprocess directory the
two containers share. :func:`build_pod_template` is pure so the rollout components can wrap it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi

from components.gpu_node_group import GPU_RESOURCE, gpu_tolerations, node_selector
from components.model_cache import CACHE_MOUNT_PATH, FILE_SYSTEM_PATH
from components.naming import dns_label

__all__ = [
    "API_KEYS_DIR",
    "API_KEYS_SECRET_KEY",
    "GRPC_PORT",
    "HEALTH_PORT",
    "METRICS_PORT",
    "MULTIPROC_DIR",
    "OPENAI_PORT",
    "SERVING_MODES",
    "TRITON_ANNOTATION",
    "VLLM_ANNOTATION",
    "ModelServiceArgs",
    "build_pod_template",
    "pod_selector",
    "serving_mode_from_manifest",
]

GRPC_PORT = 8001
OPENAI_PORT = 8080
HEALTH_PORT = 8081
METRICS_PORT = 9400
MULTIPROC_DIR = "/var/run/llm-serving/prometheus"
SCRATCH_DIR = "/var/lib/llm-serving"
SERVING_MODES = ("standalone", "embedded")
SERVING_CONTAINER = "triton"
# The OpenAI frontend's API keys: a Secret whose key holds SHA-256 hex digests, one per line.
API_KEYS_DIR = "/etc/llm-serving/api-keys"
API_KEYS_SECRET_KEY = "sha256-digests"
# Endpoints drop the pod during the preStop sleep, before SIGTERM reaches the entrypoint.
PRESTOP_SECONDS = 15
# The entrypoint stops its children one after another (frontend, then Triton), each given the
# drain deadline plus 5 s before SIGKILL: the grace period must outlast both.
_STOP_MARGIN_SECONDS = 5
PROXY_CONTAINER = "metrics-proxy"
# The serving pair, as the policy pack reads it from the pod template.
TRITON_ANNOTATION = "llm-serving/triton-release"
VLLM_ANNOTATION = "llm-serving/vllm-version"


def serving_mode_from_manifest(text: str) -> str:
    """The serving mode a model package's ``manifest.json`` declares (its ``serving_mode``)."""
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"manifest.json is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict) or "serving_mode" not in manifest:
        raise ValueError("manifest.json: missing serving_mode (format_version 1 requires it)")
    mode = manifest["serving_mode"]
    if mode not in SERVING_MODES:
        raise ValueError(
            f"manifest.json: unsupported serving_mode {mode!r}; "
            f"expected one of: {', '.join(SERVING_MODES)}"
        )
    return str(mode)


@dataclass(frozen=True)
class ModelServiceArgs:
    """Inputs of one model version's service."""

    model_id: str
    """Model id, as in ``models/<model_id>/`` of the model bucket."""
    version: str
    """Model version, as in ``models/<model_id>/<version>/``."""
    namespace: str
    """Kubernetes namespace."""
    image: pulumi.Input[str]
    """The serving image (entrypoint, Triton, vLLM, metrics proxy)."""
    serving_mode: pulumi.Input[str]
    """``standalone`` or ``embedded`` (OpenAI frontend), read from the package manifest."""
    bucket_name: pulumi.Input[str]
    """The region's model bucket, the fallback source of the package."""
    oidc_provider_arn: pulumi.Input[str]
    """The cluster's IAM OIDC provider, trusted by the IRSA role."""
    oidc_issuer: pulumi.Input[str]
    """The cluster's OIDC issuer host and path (no ``https://``)."""
    cache_claim_name: str
    """Read-only claim of the FSx model cache."""
    node_group: str
    """GPU node group the pods are pinned to."""
    gpus: int = 1
    """GPUs per pod (requests equal limits)."""
    cpu: int = 8
    """CPUs of the serving container (requests equal limits)."""
    memory_gib: int = 64
    """Memory of the serving container (requests equal limits)."""
    shm_gib: int = 16
    """``/dev/shm`` size, used by NCCL and vLLM workers."""
    replicas: int = 1
    """Pods, and KEDA's floor when scaling is on."""
    max_replicas: int | None = None
    """Enables KEDA scaling on ``vllm:num_requests_waiting`` up to this many pods."""
    queue_target: int = 8
    """Waiting requests per pod that KEDA aims for."""
    colour: str = "stable"
    """Rollout colour, exported to the metrics as the ``colour`` label."""
    service_name: str | None = None
    """Name of the Service and workload; ``None``: ``<model_id>-<version>``."""
    startup_timeout_s: int = 1800
    """How long a cold start (package unpack, weights into GPU memory) may take."""
    create_workload: bool = True
    """``False`` when a rollout component wraps :func:`build_pod_template` itself; that
    workload must be named :attr:`name` and be of ``external_workload`` (KEDA scales it)."""
    external_workload: tuple[str, str] = ("argoproj.io/v1alpha1", "Rollout")
    """``apiVersion`` and ``kind`` of the workload a rollout component creates instead."""
    create_service: bool = True
    """``False`` when a rollout component brings its own Services (Red-Black's stable and
    canary); the pods are then scraped through a PodMonitor, each exactly once."""
    strategy: str | None = None
    """Rollout strategy (``red-black``, ``versioned``), labelled ``llm-serving/strategy``."""
    service_annotations: Mapping[str, str] = field(default_factory=dict)
    """Extra annotations of the Service (the Versioned age policy reads them there)."""
    also_reads: Sequence[str] = ()
    """Further versions the IRSA role may read: during a Red-Black rollout the previous
    colour's pods still serve (and may restart into) the previous version."""
    depends_on: Sequence[pulumi.Resource] = ()
    """What must exist or finish first: the namespace and the version's materialize Job."""
    prometheus_url: str = "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
    """Prometheus that KEDA queries."""
    metrics_proxy_command: Sequence[str] = ("python", "-m", "runtime.metrics_proxy")
    """Command of the metrics-proxy sidecar in the serving image."""
    triton_release: str | None = None
    """Triton release of the image (``26.08``), annotated for the policy pack and operators."""
    vllm_version: str | None = None
    """vLLM version the image pairs with that release (``images/compat.toml``), annotated."""
    served_model_id: str | None = None
    """Model id OpenAI clients send and ``/v1/models`` lists (embedded mode); ``None``:
    :attr:`model_id`."""
    api_keys_secret: str | None = None
    """Secret (in :attr:`namespace`) whose key ``sha256-digests`` lists the SHA-256 hex
    digests of accepted OpenAI API keys, one per line; ``None``: the frontend is open."""
    drain_seconds: int = 45
    """SIGTERM drain deadline of the entrypoint; the pod's grace period is sized from it."""

    @property
    def name(self) -> str:
        """Name of the Service, the workload and the service account."""
        return self.service_name or dns_label(self.model_id, self.version)

    @property
    def package_path(self) -> str:
        """Where the version's package lies in the model cache."""
        return f"{CACHE_MOUNT_PATH}{FILE_SYSTEM_PATH}/{self.model_id}/{self.version}"

    @property
    def termination_grace_seconds(self) -> int:
        """Grace period that outlasts the preStop sleep and the entrypoint's whole drain."""
        return PRESTOP_SECONDS + 2 * (self.drain_seconds + _STOP_MARGIN_SECONDS) + 5

    @property
    def labels(self) -> dict[str, str]:
        """Labels of the pods (see :func:`pod_selector` for the ones that select them)."""
        labels = {
            "app.kubernetes.io/name": "llm-serving",
            "app.kubernetes.io/instance": self.name,
            "llm-serving/model-id": dns_label(self.model_id),
            "llm-serving/model-version": dns_label(self.version),
            "llm-serving/colour": self.colour,
        }
        if self.strategy is not None:
            labels["llm-serving/strategy"] = self.strategy
        return labels


def pod_selector(args: ModelServiceArgs) -> dict[str, str]:
    """The labels that select the pods: never the version or colour, which a rollout changes
    while the selector (immutable in a Deployment) stays."""
    return {k: args.labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}


def _annotations(args: ModelServiceArgs) -> dict[str, str]:
    pair = {
        TRITON_ANNOTATION: args.triton_release,
        VLLM_ANNOTATION: args.vllm_version,
    }
    return {key: value for key, value in pair.items() if value is not None}


def _env(args: ModelServiceArgs) -> list[dict[str, Any]]:
    return [
        {"name": "LLM_SERVING_MODEL_ID", "value": args.model_id},
        {"name": "LLM_SERVING_MODEL_VERSION", "value": args.version},
        {"name": "LLM_SERVING_COLOUR", "value": args.colour},
        {"name": "PROMETHEUS_MULTIPROC_DIR", "value": MULTIPROC_DIR},
    ]


def _serving_env(args: ModelServiceArgs) -> list[dict[str, Any]]:
    """The entrypoint's own settings, and what the embedded frontend needs beyond what the
    entrypoint passes it (Triton address, model name, tokenizer, port, release, max model len).

    The serving mode is read from the package manifest, possibly only at deploy time, so the
    frontend's variables are always set; only the frontend, started in embedded mode, reads them.
    """
    env: list[dict[str, Any]] = [
        {"name": "LLM_SERVING_PACKAGE_PATH", "value": args.package_path},
        # The entrypoint unpacks the package there: the node's local NVMe (GpuNodeGroup).
        {"name": "LLM_SERVING_WORK_DIR", "value": SCRATCH_DIR},
        {
            "name": "LLM_SERVING_PACKAGE_S3_URI",
            "value": pulumi.Output.concat(
                "s3://", args.bucket_name, f"/models/{args.model_id}/{args.version}/"
            ),
        },
        {"name": "LLM_SERVING_DRAIN_SECONDS", "value": str(args.drain_seconds)},
        {
            "name": "LLM_SERVING_FRONTEND_SERVED_MODEL_ID",
            "value": args.served_model_id or args.model_id,
        },
    ]
    if args.triton_release is not None:
        env.append({"name": "LLM_SERVING_TRITON_RELEASE", "value": args.triton_release})
    if args.api_keys_secret is not None:
        env.append(
            {
                "name": "LLM_SERVING_FRONTEND_API_KEYS_FILE",
                "value": f"{API_KEYS_DIR}/{API_KEYS_SECRET_KEY}",
            }
        )
    return env


def build_pod_template(args: ModelServiceArgs) -> dict[str, Any]:
    """The serving pod template (``metadata`` and ``spec``) of one model version."""
    _validate(args)
    compute = {
        "cpu": str(args.cpu),
        "memory": f"{args.memory_gib}Gi",
        GPU_RESOURCE: str(args.gpus),
    }
    period = 10
    serving = {
        "name": SERVING_CONTAINER,
        "image": args.image,
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT},
            {"name": "openai", "containerPort": OPENAI_PORT},
            {"name": "health", "containerPort": HEALTH_PORT},
        ],
        "env": [*_env(args), *_serving_env(args)],
        "resources": {"requests": dict(compute), "limits": dict(compute)},
        # The entrypoint answers /readyz only once the model is loaded; until then the startup
        # probe holds liveness off for the whole GPU cold start.
        "startupProbe": {
            "httpGet": {"path": "/readyz", "port": HEALTH_PORT},
            "periodSeconds": period,
            "timeoutSeconds": 5,
            "failureThreshold": -(-args.startup_timeout_s // period),
        },
        "readinessProbe": {
            "grpc": {"port": GRPC_PORT},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/livez", "port": HEALTH_PORT},
            "periodSeconds": period,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        # Endpoints drop the pod before Triton starts refusing requests.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SECONDS)]}}},
        "volumeMounts": [
            {"name": "model-cache", "mountPath": CACHE_MOUNT_PATH, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "prometheus-multiproc", "mountPath": MULTIPROC_DIR},
            {"name": "scratch", "mountPath": SCRATCH_DIR},
            *(
                [{"name": "api-keys", "mountPath": API_KEYS_DIR, "readOnly": True}]
                if args.api_keys_secret is not None
                else []
            ),
        ],
    }
    sidecar_compute = {"cpu": "250m", "memory": "256Mi"}
    proxy = {
        "name": PROXY_CONTAINER,
        "image": args.image,
        "command": list(args.metrics_proxy_command),
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
        "env": _env(args),
        "resources": {"requests": dict(sidecar_compute), "limits": dict(sidecar_compute)},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": METRICS_PORT}},
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": METRICS_PORT},
            "failureThreshold": 3,
        },
        "volumeMounts": [
            {"name": "prometheus-multiproc", "mountPath": MULTIPROC_DIR, "readOnly": True}
        ],
    }
    return {
        "metadata": {"labels": args.labels, "annotations": _annotations(args)},
        "spec": {
            "serviceAccountName": args.name,
            "nodeSelector": node_selector(args.node_group),
            "tolerations": gpu_tolerations(),
            "terminationGracePeriodSeconds": args.termination_grace_seconds,
            "containers": [serving, proxy],
            "volumes": [
                {
                    "name": "model-cache",
                    "persistentVolumeClaim": {"claimName": args.cache_claim_name, "readOnly": True},
                },
                {
                    "name": "dshm",
                    "emptyDir": {"medium": "Memory", "sizeLimit": f"{args.shm_gib}Gi"},
                },
                {"name": "prometheus-multiproc", "emptyDir": {"sizeLimit": "1Gi"}},
                # On the node's RAID0 NVMe (see GpuNodeGroup): the unpacked package.
                {"name": "scratch", "emptyDir": {"sizeLimit": "200Gi"}},
                *_api_keys_volume(args),
            ],
        },
    }


def _api_keys_volume(args: ModelServiceArgs) -> list[dict[str, Any]]:
    if args.api_keys_secret is None:
        return []
    secret = {
        "secretName": args.api_keys_secret,
        "items": [{"key": API_KEYS_SECRET_KEY, "path": API_KEYS_SECRET_KEY}],
        "defaultMode": 0o444,
    }
    return [{"name": "api-keys", "secret": secret}]


def _validate(args: ModelServiceArgs) -> None:
    if args.drain_seconds < 1:
        raise ValueError(f"drain_seconds must be at least 1, got {args.drain_seconds}")
    if args.gpus < 1:
        raise ValueError(f"gpus must be at least 1, got {args.gpus}")
    if args.max_replicas is not None and args.max_replicas < max(args.replicas, 1):
        raise ValueError(
            f"max_replicas ({args.max_replicas}) must be at least replicas ({args.replicas})"
        )
    if args.startup_timeout_s < 60:
        raise ValueError(f"startup_timeout_s must be at least 60, got {args.startup_timeout_s}")
    if isinstance(args.serving_mode, str) and args.serving_mode not in SERVING_MODES:
        raise ValueError(
            f"unsupported serving_mode {args.serving_mode!r}; "
            f"expected one of: {', '.join(SERVING_MODES)}"
        )
