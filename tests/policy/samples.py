"""Resource property dicts shaped like the engine's view of real resources (camelCase inputs)."""

from __future__ import annotations

import copy
from typing import Any

DIGEST = "sha256:" + "ab" * 32
ROLLOUT = "kubernetes:argoproj.io/v1alpha1:Rollout"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"


def serving_pod(**overrides: Any) -> dict[str, Any]:
    """A pod template like the serving one: GPU container with probes, sidecar, toleration."""
    pod: dict[str, Any] = {
        "metadata": {
            "labels": {"app.kubernetes.io/name": "llama", "llm-serving/model-id": "llama"},
            "annotations": {
                "llm-serving/triton-release": "26.08",
                "llm-serving/vllm-version": "0.27.1",
            },
        },
        "spec": {
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "containers": [
                {
                    "name": "serving",
                    "image": f"123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-serving@{DIGEST}",
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1", "memory": "64Gi"},
                        "requests": {"nvidia.com/gpu": "1", "memory": "64Gi"},
                    },
                    "startupProbe": {
                        "httpGet": {"path": "/readyz", "port": 8081},
                        "periodSeconds": 10,
                        "failureThreshold": 180,
                    },
                    "readinessProbe": {"grpc": {"port": 8001}},
                },
                {
                    "name": "metrics-proxy",
                    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-serving:0.1.0",
                },
            ],
        },
    }
    pod.update(overrides)
    return pod


def deployment(pod: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "llama-v1"},
        "spec": {"replicas": 2, "template": pod if pod is not None else serving_pod()},
    }


def rollout(steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": "llama"},
        "spec": {
            "template": serving_pod(),
            "strategy": {"canary": {"dynamicStableScale": True, "steps": steps}},
        },
    }


def analysis() -> dict[str, Any]:
    return {"analysis": {"templates": [{"templateName": "llama-analysis"}]}}


def without(pod: dict[str, Any], container: str, key: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    for c in pod["spec"]["containers"]:
        if c["name"] == container:
            c.pop(key)
    return pod
