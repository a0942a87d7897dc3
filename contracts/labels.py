"""Kubernetes label, annotation and resource names, and the environment variables the pods set,
spelled once for the components that write them and the policy pack and runtime that read them.
"""

from __future__ import annotations

__all__ = [
    "AMI_FAMILY_LABEL",
    "COLOUR_ENV",
    "COLOUR_LABEL",
    "CREATED_AT_ANNOTATION",
    "GPU_RESOURCE",
    "MODEL_ID_ENV",
    "MODEL_ID_LABEL",
    "MODEL_VERSION_ANNOTATION",
    "MODEL_VERSION_ENV",
    "MODEL_VERSION_LABEL",
    "MULTIPROC_DIR_ENV",
    "NEWEST_ANNOTATION",
    "NODE_GROUP_LABEL",
    "NODE_ROLE_LABEL",
    "POD_HASH_LABEL",
    "ROLLOUT_STATUS_LABEL",
    "ROUTE_WEIGHT_ANNOTATION",
    "STRATEGY_LABEL",
    "TRITON_ANNOTATION",
    "VLLM_ANNOTATION",
]

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource GPU pods request and GPU nodes are tainted with."""

# Labels of the serving pods and the objects around them.
MODEL_ID_LABEL = "llm-serving/model-id"
MODEL_VERSION_LABEL = "llm-serving/model-version"
COLOUR_LABEL = "llm-serving/colour"
STRATEGY_LABEL = "llm-serving/strategy"
ROLLOUT_STATUS_LABEL = "llm-serving/rollout-status"
POD_HASH_LABEL = "rollouts-pod-template-hash"
"""Argo Rollouts' label of a ReplicaSet's pods: a Red-Black pod's colour."""

# Labels of the nodes.
NODE_GROUP_LABEL = "llm-serving/node-group"
NODE_ROLE_LABEL = "llm-serving/node-role"
AMI_FAMILY_LABEL = "llm-serving/ami-family"

# Annotations: the serving pair on pod templates (read by the policy pack), the served version
# on a Rollout, and a Versioned version's age on its Service (read by the advisory age policy).
TRITON_ANNOTATION = "llm-serving/triton-release"
VLLM_ANNOTATION = "llm-serving/vllm-version"
MODEL_VERSION_ANNOTATION = "llm-serving/model-version"
CREATED_AT_ANNOTATION = "llm-serving/created-at"
NEWEST_ANNOTATION = "llm-serving/newest"
ROUTE_WEIGHT_ANNOTATION = "llm-serving/route-weight"

# Environment of the serving and metrics-proxy containers that label every series.
MODEL_ID_ENV = "LLM_SERVING_MODEL_ID"
MODEL_VERSION_ENV = "LLM_SERVING_MODEL_VERSION"
COLOUR_ENV = "LLM_SERVING_COLOUR"
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
