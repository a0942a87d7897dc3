"""The workload validators on passing and failing Kubernetes resources."""

from __future__ import annotations

import copy

import pytest

from policy.workloads import (
    check_gpu_pods_tolerate_taint,
    check_gpu_startup_probes,
    check_images_pinned,
    check_red_black_steps,
    check_serving_pair_supported,
    image_problem,
)
from tests.policy.samples import (
    DEPLOYMENT,
    DIGEST,
    ROLLOUT,
    analysis,
    deployment,
    rollout,
    serving_pod,
    without,
)

PAIRS = {("26.08", "0.27.1"), ("26.07", "0.24.0")}


def test_gpu_pod_with_toleration_passes() -> None:
    assert check_gpu_pods_tolerate_taint(DEPLOYMENT, deployment()) == []


def test_gpu_pod_without_toleration_fails() -> None:
    pod = serving_pod()
    pod["spec"]["tolerations"] = [{"key": "other", "operator": "Exists"}]
    messages = check_gpu_pods_tolerate_taint(DEPLOYMENT, deployment(pod))
    assert len(messages) == 1
    assert "nvidia.com/gpu" in messages[0] and "Deployment llama-v1" in messages[0]


def test_toleration_with_other_effect_does_not_count() -> None:
    pod = serving_pod()
    pod["spec"]["tolerations"] = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}
    ]
    assert check_gpu_pods_tolerate_taint(DEPLOYMENT, deployment(pod)) != []


def test_cpu_pod_needs_no_toleration() -> None:
    pod = serving_pod()
    pod["spec"]["tolerations"] = []
    for c in pod["spec"]["containers"]:
        c.pop("resources", None)
    assert check_gpu_pods_tolerate_taint(DEPLOYMENT, deployment(pod)) == []


def test_rollout_pod_template_is_checked() -> None:
    body = rollout([{"setWeight": 100}, analysis()])
    body["spec"]["template"]["spec"]["tolerations"] = []
    assert check_gpu_pods_tolerate_taint(ROLLOUT, body) != []


def test_startup_probe_present_passes() -> None:
    assert check_gpu_startup_probes(DEPLOYMENT, deployment()) == []


def test_gpu_container_without_startup_probe_fails() -> None:
    pod = without(serving_pod(), "serving", "startupProbe")
    messages = check_gpu_startup_probes(DEPLOYMENT, deployment(pod))
    assert len(messages) == 1 and "'serving'" in messages[0] and "startupProbe" in messages[0]


def test_sidecar_without_gpu_needs_no_startup_probe() -> None:
    pod = serving_pod()
    assert "startupProbe" not in pod["spec"]["containers"][1]
    assert check_gpu_startup_probes(DEPLOYMENT, deployment(pod)) == []


@pytest.mark.parametrize(
    "image",
    [
        f"nvcr.io/nvidia/tritonserver@{DIGEST}",
        "nvcr.io/nvidia/tritonserver:26.08-vllm-python-py3",
        "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.10.1",
        "localhost:5000/llm-serving:0.1.0",
    ],
)
def test_pinned_images_pass(image: str) -> None:
    assert image_problem(image) is None


@pytest.mark.parametrize(
    ("image", "reason"),
    [
        ("nvcr.io/nvidia/tritonserver:latest", "latest"),
        ("nvcr.io/nvidia/tritonserver", "no tag"),
        ("localhost:5000/llm-serving", "no tag"),
        ("nvcr.io/nvidia/tritonserver:main", "not a release tag"),
    ],
)
def test_unpinned_images_fail(image: str, reason: str) -> None:
    problem = image_problem(image)
    assert problem is not None and reason in problem


def test_images_checked_in_every_container() -> None:
    pod = serving_pod()
    pod["spec"]["containers"][1]["image"] = "busybox:latest"
    pod["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
    messages = check_images_pinned(DEPLOYMENT, deployment(pod))
    assert len(messages) == 2
    assert any("'metrics-proxy'" in m for m in messages)
    assert any("'init'" in m for m in messages)
    assert check_images_pinned(DEPLOYMENT, deployment()) == []


def test_supported_pair_passes() -> None:
    assert check_serving_pair_supported(DEPLOYMENT, deployment(), PAIRS) == []


def test_unsupported_pair_fails_and_lists_supported() -> None:
    pod = serving_pod()
    pod["metadata"]["annotations"]["llm-serving/vllm-version"] = "0.33.0"
    messages = check_serving_pair_supported(DEPLOYMENT, deployment(pod), PAIRS)
    assert len(messages) == 1
    assert "0.33.0" in messages[0] and "26.07/0.24.0, 26.08/0.27.1" in messages[0]


def test_gpu_pod_without_pair_annotations_fails() -> None:
    pod = serving_pod()
    pod["metadata"]["annotations"] = {}
    messages = check_serving_pair_supported(DEPLOYMENT, deployment(pod), PAIRS)
    assert messages and "llm-serving/triton-release" in messages[0]


def test_steps_ending_at_100_with_analyses_pass() -> None:
    steps = [
        {"setWeight": 10},
        analysis(),
        {"setWeight": 50},
        {"pause": {"duration": "5m"}},
        analysis(),
        {"setWeight": 100},
        analysis(),
    ]
    assert check_red_black_steps(ROLLOUT, rollout(steps)) == []


def test_steps_not_ending_at_100_fail() -> None:
    messages = check_red_black_steps(ROLLOUT, rollout([{"setWeight": 50}, analysis()]))
    assert messages == ["Rollout llama: the last setWeight is 50; Red-Black steps must end at 100"]


def test_step_without_analysis_fails() -> None:
    steps = [{"setWeight": 25}, {"pause": {}}, {"setWeight": 100}, analysis()]
    messages = check_red_black_steps(ROLLOUT, rollout(steps))
    assert len(messages) == 1 and "steps[0] (setWeight 25)" in messages[0]


def test_background_analysis_covers_every_step() -> None:
    body = rollout([{"setWeight": 25}, {"setWeight": 100}])
    body["spec"]["strategy"]["canary"]["analysis"] = copy.deepcopy(analysis()["analysis"])
    assert check_red_black_steps(ROLLOUT, body) == []


def test_rollout_without_weights_or_canary_fails() -> None:
    assert check_red_black_steps(ROLLOUT, rollout([analysis()])) != []
    body = rollout([])
    body["spec"]["strategy"] = {"blueGreen": {"activeService": "x"}}
    assert "canary is missing" in check_red_black_steps(ROLLOUT, body)[0]


def test_other_types_are_ignored() -> None:
    assert check_red_black_steps(DEPLOYMENT, deployment()) == []
    assert check_gpu_startup_probes("aws:s3/bucket:Bucket", {"bucket": "x"}) == []


def test_pair_taken_from_the_image_tag_without_annotations() -> None:
    pod = serving_pod()
    pod["metadata"]["annotations"] = {}
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-serving:0.1.0-triton26.08"
    pod["spec"]["containers"][0]["image"] = image
    assert check_serving_pair_supported(DEPLOYMENT, deployment(pod), PAIRS) == []
    pod["spec"]["containers"][0]["image"] = image.replace("26.08", "25.01")
    messages = check_serving_pair_supported(DEPLOYMENT, deployment(pod), PAIRS)
    assert len(messages) == 1 and "Triton 25.01 is not a release listed" in messages[0]


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Equal", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": ""},
        {"operator": "Exists"},
        {"operator": "Exists", "effect": "NoSchedule"},
    ],
)
def test_kubernetes_matching_tolerations_pass(toleration: dict[str, str]) -> None:
    pod = serving_pod()
    pod["spec"]["tolerations"] = [toleration]
    assert check_gpu_pods_tolerate_taint(DEPLOYMENT, deployment(pod)) == []


@pytest.mark.parametrize(
    "toleration",
    [
        # The platform's taint has no value, so Equal with a value does not match it.
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
        {"operator": "Exists", "effect": "NoExecute"},
        {"operator": "Equal", "effect": "NoSchedule"},
    ],
)
def test_kubernetes_non_matching_tolerations_fail(toleration: dict[str, str]) -> None:
    pod = serving_pod()
    pod["spec"]["tolerations"] = [toleration]
    assert check_gpu_pods_tolerate_taint(DEPLOYMENT, deployment(pod)) != []


@pytest.mark.parametrize("weight", ["100", "50", "abc", 50.5, True])
def test_weight_that_is_not_an_integer_is_a_finding(weight: object) -> None:
    # setWeight is an int32 in the Rollout CRD: the API server refuses even "50".
    steps = [{"setWeight": 10}, analysis(), {"setWeight": weight}, analysis()]
    messages = check_red_black_steps(ROLLOUT, rollout(steps))
    assert messages == [
        f"Rollout llama: steps[2].setWeight is {weight!r}, not an integer; write a whole "
        "number from 0 to 100, unquoted (setWeight: 50)"
    ]


def test_whole_float_weight_from_the_engine_is_an_integer() -> None:
    steps = [{"setWeight": 25.0}, analysis(), {"setWeight": 100.0}, analysis()]
    assert check_red_black_steps(ROLLOUT, rollout(steps)) == []
    steps[-2] = {"setWeight": 50.0}
    assert check_red_black_steps(ROLLOUT, rollout(steps)) == [
        "Rollout llama: the last setWeight is 50; Red-Black steps must end at 100"
    ]
