"""The wait for a Red-Black rollout: a Job per revision that runs Argo's own status command.

Argo's status command waits for the controller to observe the new spec (its observedGeneration
is a string, which no ``pulumi.com/waitFor`` expression can compare with metadata.generation),
then exits 0 when Healthy and non-zero when the rollout aborts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from contracts.labels import ROLLOUT_STATUS_LABEL

__all__ = ["STATUS_IMAGE", "StatusWait", "create_status_wait"]

STATUS_IMAGE = "quay.io/argoproj/kubectl-argo-rollouts:v1.7.2"


@dataclass(frozen=True)
class StatusWait:
    """What the status Job waits for."""

    model_id: str
    """Model id, labelled on the Job's pod."""
    version: str
    """The version being rolled out (part of the revision's digest)."""
    namespace: pulumi.Input[str]
    """Namespace of the Rollout and of the Job."""
    template: Mapping[str, Any]
    """The Rollout's pod template (part of the revision's digest)."""
    rollout: pulumi.Resource
    """The Rollout, which the Job waits for."""
    rollout_name: pulumi.Output[str]
    """The Rollout's ``metadata.name``."""
    image: str = STATUS_IMAGE
    """Image of ``kubectl argo rollouts``."""
    timeout_seconds: int = 7200
    """How long ``pulumi up`` waits for the rollout to settle."""


def create_status_wait(
    name: str,
    wait: StatusWait,
    metadata: Callable[..., dict[str, Any]],
    opts: pulumi.ResourceOptions,
) -> k8s.batch.v1.Job:
    """A Job per revision running ``kubectl argo rollouts status``; Pulumi waits for Jobs to
    complete, so ``pulumi up`` ends when the rollout is Healthy and fails when it aborts.

    ``metadata(**extra)`` gives each object's metadata (namespace, labels); ``opts`` its
    parent and dependencies.
    """
    account = k8s.core.v1.ServiceAccount(f"{name}-status", metadata=metadata(), opts=opts)
    role = k8s.rbac.v1.Role(
        f"{name}-status",
        metadata=metadata(),
        # `kubectl argo rollouts status` runs Argo's view controller, whose informers must
        # sync before its --timeout starts; without list/watch on each it waits until the
        # Job's deadline. Deployments back workloadRef Rollouts: unread, their informer
        # would still retry and flood the log that becomes the Job's failure message.
        rules=[
            {
                "apiGroups": ["argoproj.io"],
                "resources": ["rollouts", "analysisruns", "experiments"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["apps"],
                "resources": ["replicasets", "deployments"],
                "verbs": ["get", "list", "watch"],
            },
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        ],
        opts=opts,
    )
    binding = k8s.rbac.v1.RoleBinding(
        f"{name}-status",
        metadata=metadata(),
        role_ref={
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role.metadata.name,
        },
        subjects=[
            {
                "kind": "ServiceAccount",
                "name": account.metadata.name,
                "namespace": wait.namespace,
            }
        ],
        opts=opts,
    )
    # One Job per revision: the name carries a digest of the version and the pod template,
    # so an unchanged stack keeps its finished Job and any change starts a new wait.
    revision = pulumi.Output.json_dumps({"version": wait.version, "template": wait.template})
    digest = revision.apply(lambda text: hashlib.sha256(text.encode()).hexdigest()[:10])
    rollout_name = wait.rollout_name
    timeout = wait.timeout_seconds
    container = {
        "name": "rollout-status",
        "image": wait.image,
        # The command's last lines (Argo's abort reason) become the pod's termination
        # message, which Pulumi reports with the failed Job.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "args": rollout_name.apply(
            lambda name: [
                "status",
                name,
                "--namespace",
                wait.namespace,
                "--timeout",
                f"{timeout}s",
            ]
        ),
        "resources": {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"cpu": "100m", "memory": "64Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    annotations = {"pulumi.com/timeoutSeconds": str(timeout + 300)}
    return k8s.batch.v1.Job(
        f"{name}-status",
        metadata=metadata(
            name=pulumi.Output.all(rollout_name, digest).apply(
                lambda parts: f"{parts[0][:40].rstrip('-')}-status-{parts[1]}"
            ),
            annotations=annotations,
        ),
        spec={
            "backoffLimit": 0,
            "activeDeadlineSeconds": timeout + 120,
            "template": {
                # Not the serving labels: no selector of the model's pods may match it.
                "metadata": {"labels": {ROLLOUT_STATUS_LABEL: wait.model_id}},
                "spec": {
                    "serviceAccountName": account.metadata.name,
                    "restartPolicy": "Never",
                    "containers": [container],
                },
            },
        },
        opts=pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(depends_on=[wait.rollout, binding])
        ),
    )
