"""A realistic serving pod template, shaped like ``build_pod_template``'s (contract 6)."""

from __future__ import annotations

from typing import Any

from contracts.promql import rollout_queries, rollout_success_conditions

DIGEST = "sha256:" + "cd" * 32
IMAGE = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-serving@{DIGEST}"


def pod_template(model_id: str = "llama", version: str = "2026-11-15") -> dict[str, Any]:
    env = [
        {"name": "LLM_SERVING_MODEL_ID", "value": model_id},
        {"name": "LLM_SERVING_MODEL_VERSION", "value": version},
        {"name": "LLM_SERVING_COLOUR", "value": "unset"},
        {"name": "PROMETHEUS_MULTIPROC_DIR", "value": "/var/run/llm-serving/prometheus"},
    ]
    mounts = [{"name": "prometheus", "mountPath": "/var/run/llm-serving/prometheus"}]
    return {
        "metadata": {
            "labels": {
                "app.kubernetes.io/name": "llm-serving",
                "app.kubernetes.io/instance": f"{model_id}-{version}",
                "llm-serving/model-id": model_id,
                "llm-serving/model-version": version,
                "llm-serving/colour": "stable",
            },
            "annotations": {
                "llm-serving/triton-release": "26.08",
                "llm-serving/vllm-version": "0.27.1",
            },
        },
        "spec": {
            "serviceAccountName": f"{model_id}-serving",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "containers": [
                {
                    "name": "serving",
                    "image": IMAGE,
                    "args": ["python", "-m", "runtime.entrypoint"],
                    "env": [
                        *env,
                        {
                            "name": "LLM_SERVING_PACKAGE_PATH",
                            "value": f"/mnt/model-cache/models/{model_id}/{version}",
                        },
                    ],
                    "ports": [
                        {"name": "grpc", "containerPort": 8001},
                        {"name": "http", "containerPort": 8080},
                        {"name": "health", "containerPort": 8081},
                    ],
                    "resources": {
                        "limits": {"nvidia.com/gpu": "4", "memory": "320Gi", "cpu": "48"},
                        "requests": {"nvidia.com/gpu": "4", "memory": "320Gi", "cpu": "48"},
                    },
                    "startupProbe": {
                        "httpGet": {"path": "/readyz", "port": 8081},
                        "periodSeconds": 10,
                        "failureThreshold": 180,
                    },
                    "readinessProbe": {"grpc": {"port": 8001}, "periodSeconds": 5},
                    "livenessProbe": {"httpGet": {"path": "/livez", "port": 8081}},
                    "volumeMounts": [
                        *mounts,
                        {"name": "model-cache", "mountPath": "/mnt/model-cache", "readOnly": True},
                    ],
                },
                {
                    "name": "metrics-proxy",
                    "image": IMAGE,
                    "args": ["python", "-m", "runtime.metrics_proxy"],
                    "env": env,
                    "ports": [{"name": "metrics", "containerPort": 9400}],
                    "volumeMounts": mounts,
                },
            ],
            "volumes": [
                {"name": "prometheus", "emptyDir": {}},
                {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}},
            ],
        },
    }


def queries() -> dict[str, str]:
    return rollout_queries()


def success_conditions() -> dict[str, str]:
    return rollout_success_conditions()
