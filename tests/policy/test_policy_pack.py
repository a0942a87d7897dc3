"""The CrossGuard pack itself, run in its own virtualenv (``.venv-policy``, built by make setup).

pulumi-policy pins protobuf 5 and cannot be imported in the main venv, so this test runs a
small script there: it builds every policy with a temporary compat matrix and calls each one's
``validate`` with pulumi-policy's own ``ResourceValidationArgs`` (or, for stack policies,
``StackValidationArgs`` over all the cases) on passing and failing resources.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.policy.policy_venv import run_in_policy_venv
from tests.policy.samples import DEPLOYMENT, ROLLOUT, analysis, deployment, rollout, serving_pod

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"

SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from pulumi_policy import (
        EnforcementLevel, PolicyResource, ResourceValidationArgs, ResourceValidationPolicy,
        StackValidationArgs,
    )
    from policy.pack import PACK_NAME, build_policies

    cases = json.loads(sys.stdin.read())
    policies = build_policies(Path(sys.argv[2]))
    out = {"pack": PACK_NAME, "levels": {}, "violations": []}
    for policy in policies:
        out["levels"][policy.name] = policy.enforcement_level.value
    found = [set() for _ in cases]
    stack = [
        PolicyResource(case["type"], case["props"], f"urn:{i}", f"r{i}", None, None, None, [], {})
        for i, case in enumerate(cases)
    ]
    for resource, case in zip(stack, cases):
        for key, indices in case.get("dependsOn", {}).items():
            resource.property_dependencies[key] = [stack[i] for i in indices]
    for policy in policies:
        if not isinstance(policy, ResourceValidationPolicy):
            def report(message, urn=None, p=policy.name):
                found[int(urn.removeprefix("urn:"))].add(p)
            policy.validate(StackValidationArgs(stack), report)
            continue
        for i, case in enumerate(cases):
            args = ResourceValidationArgs(
                case["type"], case["props"], "urn:x", "r", None, None, {"idleWindowHours": 24}
            )
            policy.validate(args, lambda message, urn=None, p=policy.name, i=i: found[i].add(p))
    out["violations"] = [sorted(f) for f in found]
    print(json.dumps(out))
    """
)


def run_pack(cases: list[dict], tmp_path: Path) -> dict:
    compat = tmp_path / "compat.toml"
    compat.write_text(
        'format_version = 1\ndefault_triton = "26.08"\n[[pairs]]\ntriton = "26.08"\n'
        'vllm = "0.27.1"\nstructured_outputs_key = "structured_outputs"\npython = "3.12"\n'
        'backend_modules = ["vllm"]\n',
        encoding="utf-8",
    )
    return run_in_policy_venv(SCRIPT, cases, str(compat))


def test_pack_reports_each_failing_resource_under_its_policy(tmp_path: Path) -> None:
    unpinned = serving_pod()
    unpinned["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/tritonserver:latest"
    unpinned["metadata"]["annotations"]["llm-serving/vllm-version"] = "0.33.0"
    cases = [
        {"type": DEPLOYMENT, "props": deployment()},
        {"type": DEPLOYMENT, "props": deployment(unpinned)},
        {"type": ROLLOUT, "props": rollout([{"setWeight": 10}, {"setWeight": 100}, analysis()])},
        {
            "type": "aws:ec2/launchTemplate:LaunchTemplate",
            "props": {"metadataOptions": {"httpTokens": "optional"}},
        },
        {"type": "aws:fsx/lustreFileSystem:LustreFileSystem", "props": {}},
        {
            "type": "aws:ec2/launchTemplate:LaunchTemplate",
            "props": {"instanceType": "g6e.xlarge", "metadataOptions": {"httpTokens": "required"}},
        },
        {"type": NODE_GROUP, "props": {"amiType": "CUSTOM"}, "dependsOn": {"launchTemplate": [5]}},
    ]
    out = run_pack(cases, tmp_path)
    assert out["pack"] == "llm-serving-platform"
    assert out["violations"] == [
        [],
        ["images-pinned", "serving-pair-in-compat-matrix"],
        ["red-black-steps-end-at-100-with-analysis"],
        ["imdsv2-required"],
        ["fsx-encrypted"],
        [],
        ["gpu-launch-template-node-groups-tainted"],
    ]
    assert out["levels"]["versioned-older-than-idle-window"] == "advisory"
    mandatory = [name for name, level in out["levels"].items() if level == "mandatory"]
    assert len(mandatory) == 12
