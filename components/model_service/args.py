"""``ModelServiceArgs``: the inputs of one model version's service, and the constants of the pod
it runs (contract 5: ports, paths, the Secret of API keys)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi

from components.model_cache import CACHE_MOUNT_PATH, FILE_SYSTEM_PATH
from contracts.labels import COLOUR_LABEL, MODEL_ID_LABEL, MODEL_VERSION_LABEL, STRATEGY_LABEL
from contracts.naming import dns_label

__all__ = [
    "API_KEYS_DIR",
    "API_KEYS_SECRET_KEY",
    "GRPC_PORT",
    "HEALTH_PORT",
    "METRICS_PORT",
    "MULTIPROC_DIR",
    "OPENAI_PORT",
    "PRESTOP_SECONDS",
    "PROXY_CONTAINER",
    "PROXY_CPU_MILLI",
    "PROXY_MEMORY_MIB",
    "SCALING_METRICS",
    "SCRATCH_DIR",
    "SERVING_CONTAINER",
    "SERVING_MODES",
    "ModelServiceArgs",
    "PodRequests",
    "RolloutWorkload",
    "ScalingTrigger",
    "pod_requests",
    "serving_mode_from_manifest",
    "validate_args",
]

GRPC_PORT = 8001
OPENAI_PORT = 8080
HEALTH_PORT = 8081
METRICS_PORT = 9400
MULTIPROC_DIR = "/var/run/llm-serving/prometheus"
SCRATCH_DIR = "/var/lib/llm-serving"
SERVING_MODES = ("standalone", "embedded")
# What KEDA can scale a model on: vLLM's waiting requests (LLMs), or Triton's own series, which
# every backend exports (average queue time per request, inference rate).
SCALING_METRICS = ("queue_size", "queue_time_us", "inference_rate")
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
# The metrics proxy's requests (and limits): it only merges and serves /metrics.
PROXY_CPU_MILLI = 250
PROXY_MEMORY_MIB = 256


@dataclass(frozen=True)
class PodRequests:
    """What one serving pod requests in all (serving container and metrics proxy)."""

    cpu_milli: int
    memory_mib: int
    gpus: int


def pod_requests(cpu: int, memory_gib: int, gpus: int) -> PodRequests:
    """The serving pod's total requests for a serving container of ``cpu``, ``memory_gib`` and
    ``gpus``: what a node must have left after its reserved capacity."""
    return PodRequests(
        cpu_milli=cpu * 1000 + PROXY_CPU_MILLI,
        memory_mib=memory_gib * 1024 + PROXY_MEMORY_MIB,
        gpus=gpus,
    )


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
class RolloutWorkload:
    """A workload that a rollout component creates from the service's pod template, named
    :attr:`ModelServiceArgs.name`; KEDA scales it and its own Services carry the traffic, so
    the pods are scraped through a PodMonitor, each exactly once."""

    api_version: str = "argoproj.io/v1alpha1"
    """``apiVersion`` of the workload."""
    kind: str = "Rollout"
    """``kind`` of the workload."""


@dataclass(frozen=True)
class ScalingTrigger:
    """What KEDA scales a model's pods on, and the value it aims for."""

    metric: str = "queue_size"
    """One of :data:`SCALING_METRICS`: ``queue_size`` (``vllm:num_requests_waiting``, LLMs),
    ``queue_time_us`` (Triton's average queue time per request), ``inference_rate`` (Triton's
    inferences per second)."""
    target: int = 8
    """Waiting requests per pod (``queue_size``), microseconds of queue time per request
    (``queue_time_us``) or inferences per second per pod (``inference_rate``)."""


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
    """Node group the pods are pinned to: a GPU group, or a CPU group when ``gpus`` is 0."""
    gpus: int = 1
    """GPUs per pod (requests equal limits); 0: no GPU request, and the pods tolerate the CPU
    model nodes' taint (``CpuNodeGroup``) instead of the GPU one."""
    cpu: int = 8
    """CPUs of the serving container (requests equal limits)."""
    memory_gib: int = 64
    """Memory of the serving container (requests equal limits)."""
    shm_gib: int = 16
    """``/dev/shm`` size, used by NCCL and vLLM workers."""
    replicas: int = 1
    """Pods, and KEDA's floor when scaling is on."""
    max_replicas: int | None = None
    """Enables KEDA scaling on :attr:`scaling` up to this many pods."""
    scaling: ScalingTrigger = field(default_factory=ScalingTrigger)
    """What KEDA scales on when :attr:`max_replicas` is set."""
    colour: str = "stable"
    """Rollout colour, exported to the metrics as the ``colour`` label."""
    service_name: str | None = None
    """Name of the Service and workload; ``None``: ``<model_id>-<version>``."""
    startup_timeout_s: int = 1800
    """How long a cold start (package unpack, weights into GPU memory) may take."""
    rollout: RolloutWorkload | None = None
    """The workload a rollout component builds around :func:`build_pod_template` instead of the
    service's own Deployment and Service (Red-Black's Rollout, with its stable and canary
    Services); ``None``: the service runs its pods itself."""
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
    metrics_proxy_command: Sequence[str] = ("python3", "-m", "runtime.metrics_proxy")
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
            MODEL_ID_LABEL: dns_label(self.model_id),
            MODEL_VERSION_LABEL: dns_label(self.version),
            COLOUR_LABEL: self.colour,
        }
        if self.strategy is not None:
            labels[STRATEGY_LABEL] = self.strategy
        return labels


def validate_args(args: ModelServiceArgs) -> None:
    """Raise `ValueError` naming the first field out of range."""
    if args.drain_seconds < 1:
        raise ValueError(f"drain_seconds must be at least 1, got {args.drain_seconds}")
    if args.gpus < 0:
        raise ValueError(f"gpus must be 0 (a CPU model) or more, got {args.gpus}")
    if args.scaling.metric not in SCALING_METRICS:
        raise ValueError(
            f"unsupported scaling metric {args.scaling.metric!r}; "
            f"expected one of: {', '.join(SCALING_METRICS)}"
        )
    if args.scaling.target < 1:
        raise ValueError(f"scaling target must be at least 1, got {args.scaling.target}")
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
