"""The serving pod of one model version (contract 5): the entrypoint gates the public KServe gRPC
port 8001, serves ``/livez`` and ``/readyz`` on 8081, the embedded OpenAI frontend listens on
8080, and the metrics-proxy sidecar serves 9400 from the multiprocess directory the two
containers share. :func:`build_pod_template` is pure so the rollout components can wrap it.
"""

from __future__ import annotations

from typing import Any

import pulumi

from components.cpu_node_group import cpu_tolerations
from components.gpu_node_group import GPU_RESOURCE, gpu_tolerations, node_selector
from components.model_cache import CACHE_MOUNT_PATH
from components.model_service.args import (
    API_KEYS_DIR,
    API_KEYS_SECRET_KEY,
    GRPC_PORT,
    HEALTH_PORT,
    METRICS_PORT,
    MULTIPROC_DIR,
    OPENAI_PORT,
    PRESTOP_SECONDS,
    PROXY_CONTAINER,
    PROXY_CPU_MILLI,
    PROXY_MEMORY_MIB,
    SCRATCH_DIR,
    SERVING_CONTAINER,
    ModelServiceArgs,
    validate_args,
)
from contracts.labels import (
    COLOUR_ENV,
    MODEL_ID_ENV,
    MODEL_VERSION_ENV,
    MULTIPROC_DIR_ENV,
    TRITON_ANNOTATION,
    VLLM_ANNOTATION,
)

__all__ = ["build_pod_template", "pod_selector"]


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
        {"name": MODEL_ID_ENV, "value": args.model_id},
        {"name": MODEL_VERSION_ENV, "value": args.version},
        {"name": COLOUR_ENV, "value": args.colour},
        {"name": MULTIPROC_DIR_ENV, "value": MULTIPROC_DIR},
    ]


def _serving_env(args: ModelServiceArgs) -> list[dict[str, Any]]:
    """The entrypoint's own settings, and what the embedded frontend needs beyond what the
    entrypoint passes it (Triton address, model name, tokenizer, port, release, max model len).

    The serving mode is read from the package manifest, possibly only at deploy time, so the
    frontend's variables are always set; only the frontend, started in embedded mode, reads them.
    """
    env: list[dict[str, Any]] = [
        {"name": "LLM_SERVING_PACKAGE_PATH", "value": args.package_path},
        # The entrypoint unpacks the package there: a GPU node's local NVMe (GpuNodeGroup), a CPU
        # node's root volume (CpuNodeGroup).
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
    validate_args(args)
    compute = {"cpu": str(args.cpu), "memory": f"{args.memory_gib}Gi"}
    if args.gpus:
        compute[GPU_RESOURCE] = str(args.gpus)
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
    sidecar_compute = {"cpu": f"{PROXY_CPU_MILLI}m", "memory": f"{PROXY_MEMORY_MIB}Mi"}
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
            "tolerations": gpu_tolerations() if args.gpus else cpu_tolerations(),
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
                # On a GPU node's RAID0 NVMe (see GpuNodeGroup): the unpacked package.
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
