"""Validators on properties shaped as the CrossGuard engine hands them, in ``.venv-policy``.

The engine sends a protobuf Struct; pulumi-policy deserializes it (numbers become floats) and
wraps lists and dicts in its unknown-checking proxies, which are Sequences and Mappings but not
``list`` or ``dict``. This test runs that same path on each case and returns the messages.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence

from tests.policy.policy_venv import run_in_policy_venv
from tests.policy.samples import DEPLOYMENT, ROLLOUT, deployment, serving_pod

ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"

SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from google.protobuf import json_format, struct_pb2
    from pulumi_policy.deserialize import deserialize_properties
    from pulumi_policy.proxy import unknown_checking_proxy
    from policy import aws, workloads

    out = []
    for case in json.loads(sys.stdin.read()):
        struct = struct_pb2.Struct()
        struct.update(case["props"])
        props = unknown_checking_proxy(deserialize_properties(json_format.MessageToDict(struct)))
        module = aws if hasattr(aws, case["check"]) else workloads
        out.append(getattr(module, case["check"])(case["type"], props))
    print(json.dumps(out))
    """
)


def run_engine_path(cases: list[dict]) -> list[list[str]]:
    return run_in_policy_venv(SCRIPT, cases)


def trust(sub_condition: dict[str, object]) -> dict[str, object]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Federated": "arn:aws:iam::1:oidc-provider/oidc.eks/id/X"},
                "Action": ["sts:AssumeRoleWithWebIdentity"],
                "Condition": sub_condition,
            }
        ],
    }


def test_policy_documents_given_as_objects_are_checked() -> None:
    wide_s3 = {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::m/*"]}
    scoped_s3 = {**wide_s3, "Resource": ["arn:aws:s3:::m/models/llama/*"]}
    pinned = {"StringEquals": {"oidc.eks/id/X:sub": "system:serviceaccount:serving:llama"}}
    wide = {"StringLike": {"oidc.eks/id/X:sub": "system:serviceaccount:*:*"}}
    irsa, s3 = "check_irsa_trust_scoped", "check_s3_access_scoped_to_prefix"
    cases = [
        {"check": irsa, "type": ROLE, "props": {"assumeRolePolicy": trust(pinned)}},
        {"check": irsa, "type": ROLE, "props": {"assumeRolePolicy": trust(wide)}},
        {"check": s3, "type": ROLE_POLICY, "props": {"policy": {"Statement": [scoped_s3]}}},
        {"check": s3, "type": ROLE_POLICY, "props": {"policy": {"Statement": [wide_s3]}}},
        {
            "check": s3,
            "type": ROLE,
            "props": {
                "inlinePolicies": [{"name": "r", "policy": json.dumps({"Statement": [wide_s3]})}]
            },
        },
    ]
    ok_trust, wide_trust, ok_s3, wide_s3_doc, inline = run_engine_path(cases)
    assert ok_trust == [] and ok_s3 == []
    assert len(wide_trust) == 1 and "StringEquals" in wide_trust[0]
    assert len(wide_s3_doc) == 1 and "'arn:aws:s3:::m/*'" in wide_s3_doc[0]
    assert len(inline) == 1 and "'arn:aws:s3:::m/*'" in inline[0]


def test_zero_gpus_from_the_engine_is_not_a_gpu_container() -> None:
    cpu_pod = serving_pod()
    cpu_pod["spec"]["tolerations"] = []
    container = cpu_pod["spec"]["containers"][0]
    container["resources"] = {"limits": {"nvidia.com/gpu": 0}, "requests": {"nvidia.com/gpu": "0"}}
    gpu_pod = serving_pod()
    gpu_pod["spec"]["tolerations"] = []
    gpu_pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 2}}
    tolerate = "check_gpu_pods_tolerate_taint"
    cases = [
        {"check": tolerate, "type": DEPLOYMENT, "props": deployment(cpu_pod)},
        {"check": tolerate, "type": DEPLOYMENT, "props": deployment(gpu_pod)},
    ]
    cpu, gpu = run_engine_path(cases)
    assert cpu == []
    assert len(gpu) == 1 and "does not tolerate" in gpu[0]


def test_weights_and_node_group_labels_from_the_engine() -> None:
    # The engine turns setWeight 100 into 100.0 and hands labels as a Mapping proxy.
    steps = [{"setWeight": 100}, {"analysis": {"templates": [{"templateName": "a"}]}}]
    quoted = [{**steps[0], "setWeight": "100"}, steps[1]]
    body = {"metadata": {"name": "llama"}, "spec": {"strategy": {"canary": {"steps": steps}}}}
    quoted_body = {**body, "spec": {"strategy": {"canary": {"steps": quoted}}}}
    node_group = {"amiType": "CUSTOM", "labels": {"nvidia.com/gpu.present": "true"}}
    red_black, tainted = "check_red_black_steps", "check_gpu_node_group_tainted"
    cases = [
        {"check": red_black, "type": ROLLOUT, "props": body},
        {"check": red_black, "type": ROLLOUT, "props": quoted_body},
        {"check": tainted, "type": "aws:eks/nodeGroup:NodeGroup", "props": node_group},
    ]
    integer, string, labelled = run_engine_path(cases)
    assert integer == []
    assert len(string) == 1 and "steps[0].setWeight is '100', not an integer" in string[0]
    assert labelled == [
        "GPU node group (label nvidia.com/gpu.present) has no taint {key: nvidia.com/gpu, "
        "effect: NO_SCHEDULE}; add it to taints"
    ]


UNKNOWN_STRING = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # pulumi-policy's unknown-string sentinel
UNKNOWN_ARRAY = "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2"

STACK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from google.protobuf import struct_pb2
    from pulumi.runtime.proto import analyzer_pb2
    from pulumi_policy import EnforcementLevel
    from pulumi_policy.policy import _PolicyAnalyzerServicer
    from policy.pack import PACK_NAME, build_policies

    request = analyzer_pb2.AnalyzeStackRequest()
    for case in json.loads(sys.stdin.read()):
        properties = struct_pb2.Struct()
        properties.update(case["props"])
        resource = request.resources.add(
            type=case["type"], urn=case["urn"], name=case["name"], properties=properties
        )
        for key, urns in case.get("propertyDependencies", {}).items():
            resource.propertyDependencies[key].urns.extend(urns)
            resource.dependencies.extend(urns)
    servicer = _PolicyAnalyzerServicer(
        PACK_NAME, "0.0.1", build_policies(), EnforcementLevel.MANDATORY
    )
    response = servicer.AnalyzeStack(request, None)
    level = analyzer_pb2.EnforcementLevel.Name
    print(json.dumps([
        {"policy": d.policyName, "urn": d.urn, "message": d.message,
         "level": level(d.enforcementLevel)}
        for d in response.diagnostics
    ]))
    """
)


def stack_resource(kind: str, name: str, props: dict, depends_on: Sequence[str] = ()) -> dict:
    resource = {"type": kind, "urn": f"urn:pulumi:prod::llm-serving::{kind}::{name}"}
    resource.update(name=name, props=props)
    if depends_on:
        resource["propertyDependencies"] = {"launchTemplate": list(depends_on)}
    return resource


def test_custom_ami_node_group_with_a_gpu_launch_template_in_a_preview() -> None:
    # A preview: the node groups' launchTemplate.id is the LaunchTemplate's unknown output.
    lt, node_group = "aws:ec2/launchTemplate:LaunchTemplate", "aws:eks/nodeGroup:NodeGroup"
    gpu_lt = stack_resource(lt, "gpu-lt", {"name": "gpu-lt-1", "instanceType": "p5.48xlarge"})
    cpu_lt = stack_resource(lt, "cpu-lt", {"name": "cpu-lt-1", "instanceType": "m7i.4xlarge"})
    custom = {"amiType": "CUSTOM", "launchTemplate": {"id": UNKNOWN_STRING, "version": "1"}}
    resources = [
        gpu_lt,
        cpu_lt,
        stack_resource(node_group, "gpu-nodes", custom, [gpu_lt["urn"]]),
        stack_resource(node_group, "cpu-nodes", custom, [cpu_lt["urn"]]),
        # Taints not known yet: skipped, and the other node groups are still checked.
        stack_resource(node_group, "later", {**custom, "taints": UNKNOWN_ARRAY}, [gpu_lt["urn"]]),
        stack_resource(
            node_group,
            "tainted",
            {**custom, "taints": [{"key": "nvidia.com/gpu", "effect": "NO_SCHEDULE"}]},
            [gpu_lt["urn"]],
        ),
    ]
    found = run_in_policy_venv(STACK_SCRIPT, resources)
    assert [(d["policy"], d["urn"]) for d in found] == [
        ("gpu-launch-template-node-groups-tainted", resources[2]["urn"])
    ]
    assert found[0]["level"] == "MANDATORY"
    assert (
        "GPU node group gpu-nodes (instanceType p5.48xlarge in launch template gpu-lt) has no "
        "taint {key: nvidia.com/gpu, effect: NO_SCHEDULE}; add it to taints" in found[0]["message"]
    )
