"""In the real region plan, each materialize Job verifies with the image its servers run, and
the plan's schema and cross-object checks still pass."""

from __future__ import annotations

from components.model_cache import CACHE_MOUNT_PATH
from stacks.config import load_stack_config
from stacks.kubernetes_objects import kubernetes_objects, validate_object
from stacks.plan import plan_program
from stacks.plan_checks import check_plan

STACK = "prod-us-east-1"


def test_materialize_jobs_verify_with_the_serving_image() -> None:
    run = plan_program(STACK)
    cluster_version = load_stack_config(STACK).cluster.version  # type: ignore[union-attr]
    manifests = [manifest for _, manifest in kubernetes_objects(run)]
    server_images = {
        container["image"]
        for m in manifests
        if m["kind"] in {"Deployment", "Rollout"}
        for container in m["spec"]["template"]["spec"]["containers"]
    }
    jobs = [
        m
        for m in manifests
        if m["kind"] == "Job"
        and m["metadata"]["labels"].get("app.kubernetes.io/name") == "model-materialize"
    ]
    assert jobs
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        # Reading the files loads them from S3: no restore step in another image.
        assert "initContainers" not in pod
        (verify,) = pod["containers"]
        assert verify["image"] in server_images, (verify["image"], server_images)
        assert verify["command"][:7] == [
            "python3",
            "-m",
            "runtime.cli",
            "package",
            "verify",
            "--jobs",
            "16",
        ]
        assert {"name": "model-cache", "mountPath": CACHE_MOUNT_PATH, "readOnly": True} in verify[
            "volumeMounts"
        ]
        assert validate_object(job, cluster_version)[1] is None
    assert check_plan(run) == []
