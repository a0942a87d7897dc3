"""Validators on resources declared through the real pulumi-aws SDK under Pulumi's mocks: the
mocks receive the engine's property names, the same ones CrossGuard hands a policy, so this
checks the validators read the keys the provider actually sends."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from policy import aws as rules
from tests.rollouts.harness import run_under_mocks
from tests.rollouts.mocks import RecordingMocks

TRUST = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Federated": "arn:aws:iam::1:oidc-provider/oidc.eks/id/X"},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {"oidc.eks/id/X:sub": "system:serviceaccount:s:llama"}},
        }
    ],
}


def declare_all(good: bool) -> RecordingMocks:
    mocks = RecordingMocks()

    def build() -> pulumi.Output:
        aws.eks.NodeGroup(
            "gpu",
            cluster_name="prod",
            node_role_arn="arn:aws:iam::1:role/node",
            subnet_ids=["subnet-1"],
            ami_type="AL2023_x86_64_NVIDIA",
            instance_types=["g6e.12xlarge"],
            scaling_config={"desired_size": 1, "max_size": 2, "min_size": 1},
            taints=[{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]
            if good
            else [],
        )
        aws.ec2.LaunchTemplate(
            "gpu", metadata_options={"http_tokens": "required" if good else "optional"}
        )
        aws.fsx.LustreFileSystem(
            "cache",
            subnet_ids="subnet-1",
            storage_capacity=2400,
            deployment_type="PERSISTENT_2",
            per_unit_storage_throughput=250,
            kms_key_id="arn:aws:kms:us-east-1:1:key/k" if good else None,
        )
        aws.vpc.SecurityGroupIngressRule(
            "lustre",
            security_group_id="sg-fsx",
            ip_protocol="tcp",
            from_port=988,
            to_port=988,
            referenced_security_group_id="sg-nodes" if good else None,
            cidr_ipv4=None if good else "0.0.0.0/0",
        )
        role = aws.iam.Role(
            "serving",
            assume_role_policy=json.dumps(
                TRUST
                if good
                else {**TRUST, "Statement": [{**TRUST["Statement"][0], "Condition": {}}]}
            ),
        )
        resource = "arn:aws:s3:::models/models/llama/*" if good else "arn:aws:s3:::models/*"
        aws.iam.RolePolicy(
            "serving",
            role=role.name,
            policy=json.dumps(
                {"Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": resource}]}
            ),
        )
        return role.arn

    run_under_mocks(mocks, build)
    return mocks


CHECKS = [
    rules.check_gpu_node_group_tainted,
    rules.check_imdsv2_required,
    rules.check_fsx_encrypted,
    rules.check_lustre_not_public,
    rules.check_irsa_trust_scoped,
    rules.check_s3_access_scoped_to_prefix,
]


def violations(mocks: RecordingMocks) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for declared in mocks.declared:
        for check in CHECKS:
            if check(declared.type, declared.inputs):
                found.setdefault(declared.type, []).append(check.__name__)
    return found


def test_compliant_resources_pass_every_validator() -> None:
    assert violations(declare_all(good=True)) == {}


def test_each_non_compliant_resource_fails_its_validator() -> None:
    assert violations(declare_all(good=False)) == {
        "aws:eks/nodeGroup:NodeGroup": ["check_gpu_node_group_tainted"],
        "aws:ec2/launchTemplate:LaunchTemplate": ["check_imdsv2_required"],
        "aws:fsx/lustreFileSystem:LustreFileSystem": ["check_fsx_encrypted"],
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": ["check_lustre_not_public"],
        "aws:iam/role:Role": ["check_irsa_trust_scoped"],
        "aws:iam/rolePolicy:RolePolicy": ["check_s3_access_scoped_to_prefix"],
    }
