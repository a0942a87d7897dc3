"""What a program run under Pulumi's mock engine declared, with lookups by type and name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pulumi.runtime.mocks import MockResourceArgs

from stacks.mock_engine import PlanMocks, ProgramRun, RecordedResource

GLOBAL_OUTPUTS = {
    "image_repository_urls": {"us-east-1": "111.dkr.ecr.us-east-1.amazonaws.com/llm"},
    "model_buckets": {"us-east-1": "models-use1"},
}


class KnownOutputMocks(PlanMocks):
    """The plan's mocks, with a deterministic stand-in for every output the cloud computes.

    Tests read those outputs where components pass them on (an ARN into a policy, the file
    system's DNS name into a PersistentVolume); a preview would leave them unknown.
    """

    def new_resource(self, args: MockResourceArgs) -> tuple[str | None, dict]:
        resource_id, outputs = super().new_resource(args)
        if resource_id:
            return resource_id, outputs
        name = args.name
        outputs.setdefault("arn", f"arn:aws:mock:::{name}")
        outputs.setdefault("name", name)
        outputs.update(_COMPUTED.get(args.typ, lambda _: {})(name))
        return f"{name}-id", outputs


_COMPUTED: dict[str, Any] = {
    "aws:fsx/lustreFileSystem:LustreFileSystem": lambda name: {
        "dnsName": f"{name}.fsx.mock.amazonaws.com",
        "mountName": "abcdefgh",
    },
    "aws:ec2/launchTemplate:LaunchTemplate": lambda name: {"latestVersion": 1},
    "aws:s3/bucket:Bucket": lambda name: {
        "bucket": f"{name}-bucket",
        "arn": f"arn:aws:s3:::{name}-bucket",
    },
    "aws:eks/cluster:Cluster": lambda name: {
        "endpoint": f"https://{name}.eks.mock.amazonaws.com",
        "identities": [{"oidcs": [{"issuer": f"https://oidc.eks.mock.amazonaws.com/id/{name}"}]}],
        "vpcConfig": {"clusterSecurityGroupId": "sg-0cluster"},
        "certificateAuthority": {"data": "bW9jaw=="},
    },
    "aws:eks/nodeGroup:NodeGroup": lambda name: {"nodeGroupName": name},
}


@dataclass
class Declared:
    """What a program declared, with lookups by type and name."""

    run: ProgramRun

    def of_type(self, type_: str) -> list[RecordedResource]:
        return [r for r in self.run.resources if r.type == type_]

    def one(self, type_: str, name_part: str = "") -> RecordedResource:
        found = [r for r in self.of_type(type_) if name_part in r.name]
        assert len(found) == 1, f"expected one {type_} named *{name_part}*, got {found}"
        return found[0]

    def by_urn(self, urn: str) -> RecordedResource:
        return next(r for r in self.run.resources if r.urn == urn)

    def kubernetes(self, kind: str) -> list[dict[str, Any]]:
        return [r.inputs for r in self.run.resources if r.type.endswith(f":{kind}")]


Declare = Callable[..., Declared]
