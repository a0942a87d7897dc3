"""The AWS validators on passing and failing resources (pulumi-aws input property shapes)."""

from __future__ import annotations

import json

import pytest

from policy.aws import (
    check_fsx_encrypted,
    check_gpu_node_group_tainted,
    check_imdsv2_required,
    check_irsa_trust_scoped,
    check_lustre_not_public,
    check_s3_access_scoped_to_prefix,
)

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}


def gpu_node_group(**extra: object) -> dict[str, object]:
    return {
        "clusterName": "prod",
        "amiType": "AL2023_x86_64_NVIDIA",
        "instanceTypes": ["g6e.12xlarge"],
        "capacityType": "ON_DEMAND",
        "taints": [GPU_TAINT],
        **extra,
    }


def test_tainted_gpu_node_group_passes() -> None:
    assert check_gpu_node_group_tainted(NODE_GROUP, gpu_node_group()) == []


def test_untainted_gpu_node_group_fails() -> None:
    messages = check_gpu_node_group_tainted(NODE_GROUP, gpu_node_group(taints=[]))
    assert len(messages) == 1 and "NO_SCHEDULE" in messages[0]


def test_gpu_detected_by_instance_type_alone() -> None:
    props = gpu_node_group(amiType="AL2023_x86_64_STANDARD", instanceTypes=["p5.48xlarge"])
    props["taints"] = [{**GPU_TAINT, "effect": "PREFER_NO_SCHEDULE"}]
    assert check_gpu_node_group_tainted(NODE_GROUP, props) != []


def test_cpu_node_group_needs_no_taint() -> None:
    props = {"amiType": "AL2023_x86_64_STANDARD", "instanceTypes": ["m7i.large"]}
    assert check_gpu_node_group_tainted(NODE_GROUP, props) == []


CUSTOM_AMI = {
    "clusterName": "prod",
    "amiType": "CUSTOM",
    "launchTemplate": {"id": "lt-1", "version": "3"},
}


@pytest.mark.parametrize(
    ("extra", "evidence"),
    [
        ({"amiType": "AL2_x86_64_GPU"}, "amiType AL2_x86_64_GPU"),
        ({"amiType": "BOTTLEROCKET_ARM_64_NVIDIA_FIPS"}, "amiType BOTTLEROCKET_ARM_64_NVIDIA_FIPS"),
        ({"labels": {"nvidia.com/gpu.present": "true"}}, "label nvidia.com/gpu.present"),
        (
            {"labels": {"k8s.amazonaws.com/accelerator": "nvidia-h100"}},
            "label k8s.amazonaws.com/accelerator",
        ),
        (
            {"taints": [{**GPU_TAINT, "effect": "PREFER_NO_SCHEDULE"}]},
            "taint nvidia.com/gpu with effect PREFER_NO_SCHEDULE",
        ),
    ],
)
def test_gpu_detected_without_gpu_instance_types(extra: dict[str, object], evidence: str) -> None:
    # A CUSTOM AMI's launch template holds the instance types; the node group's own props tell.
    messages = check_gpu_node_group_tainted(NODE_GROUP, {**CUSTOM_AMI, **extra})
    assert messages == [
        f"GPU node group ({evidence}) has no taint {{key: nvidia.com/gpu, effect: NO_SCHEDULE}}; "
        "add it to taints"
    ]
    tainted = {**CUSTOM_AMI, **extra, "taints": [GPU_TAINT]}
    assert check_gpu_node_group_tainted(NODE_GROUP, tainted) == []


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"amiType": "AL2023_x86_64_NEURON", "instanceTypes": ["inf2.xlarge"]},
        {"amiType": "BOTTLEROCKET_x86_64_FIPS", "labels": {"workload": "cpu"}},
        {"labels": {"nvidia.com/gpu.present": "false"}},
        {"taints": [{"key": "dedicated", "value": "batch", "effect": "NO_SCHEDULE"}]},
    ],
)
def test_cpu_node_groups_are_not_taken_for_gpu_ones(extra: dict[str, object]) -> None:
    assert check_gpu_node_group_tainted(NODE_GROUP, {**CUSTOM_AMI, **extra}) == []


@pytest.mark.parametrize(
    "rtype", ["aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/instance:Instance"]
)
def test_imdsv2_required(rtype: str) -> None:
    ok = {"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2}}
    assert check_imdsv2_required(rtype, ok) == []
    assert (
        "httpTokens"
        in check_imdsv2_required(rtype, {"metadataOptions": {"httpTokens": "optional"}})[0]
    )
    assert check_imdsv2_required(rtype, {}) != []


def test_fsx_encrypted_persistent_passes() -> None:
    props = {"deploymentType": "PERSISTENT_2", "kmsKeyId": "arn:aws:kms:us-east-1:1:key/abc"}
    assert check_fsx_encrypted("aws:fsx/lustreFileSystem:LustreFileSystem", props) == []


def test_fsx_without_key_or_scratch_fails() -> None:
    messages = check_fsx_encrypted(
        "aws:fsx/lustreFileSystem:LustreFileSystem", {"deploymentType": "SCRATCH_2"}
    )
    assert len(messages) == 2
    assert "PERSISTENT_2" in messages[0] and "kmsKeyId" in messages[1]


def test_lustre_ports_from_node_security_group_pass() -> None:
    props = {
        "ingress": [
            {"fromPort": 988, "toPort": 988, "protocol": "tcp", "securityGroups": ["sg-1"]},
            {"fromPort": 443, "toPort": 443, "protocol": "tcp", "cidrBlocks": ["0.0.0.0/0"]},
        ]
    }
    assert check_lustre_not_public("aws:ec2/securityGroup:SecurityGroup", props) == []


@pytest.mark.parametrize(
    ("rtype", "props"),
    [
        (
            "aws:ec2/securityGroup:SecurityGroup",
            {
                "ingress": [
                    {
                        "fromPort": 1018,
                        "toPort": 1023,
                        "protocol": "tcp",
                        "cidrBlocks": ["0.0.0.0/0"],
                    }
                ]
            },
        ),
        (
            "aws:ec2/securityGroupRule:SecurityGroupRule",
            {
                "type": "ingress",
                "fromPort": 0,
                "toPort": 0,
                "protocol": "-1",
                "ipv6CidrBlocks": ["::/0"],
            },
        ),
        (
            "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
            {"fromPort": 988, "toPort": 988, "ipProtocol": "tcp", "cidrIpv4": "0.0.0.0/0"},
        ),
    ],
)
def test_public_lustre_ports_fail(rtype: str, props: dict[str, object]) -> None:
    messages = check_lustre_not_public(rtype, props)
    assert len(messages) == 1 and "Lustre" in messages[0]


@pytest.mark.parametrize(
    ("rule", "opened"),
    [
        ({"protocol": "-1"}, "every port and protocol (protocol -1)"),
        ({"protocol": "-1", "fromPort": 0, "toPort": 0}, "every port and protocol (protocol -1)"),
        ({"protocol": "tcp", "fromPort": 988}, "TCP port 988"),
        ({"protocol": "6", "fromPort": 1000, "toPort": 1020}, "TCP ports 1000-1020"),
    ],
)
def test_public_lustre_message_names_the_opened_range(rule: dict[str, object], opened: str) -> None:
    props = {"ingress": [{**rule, "cidrBlocks": ["0.0.0.0/0"]}]}
    assert check_lustre_not_public("aws:ec2/securityGroup:SecurityGroup", props) == [
        f"ingress on {opened} from 0.0.0.0/0 exposes the Lustre ports; allow only the node "
        "groups' security group"
    ]


EKS_PROVIDER = "arn:aws:iam::1:oidc-provider/oidc.eks/id/X"


def trust(condition: dict[str, object]) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Federated": EKS_PROVIDER},
                    "Action": "sts:AssumeRoleWithWebIdentity",
                    "Condition": condition,
                }
            ],
        }
    )


def test_irsa_trust_pinned_to_service_account_passes() -> None:
    props = {
        "assumeRolePolicy": trust(
            {
                "StringEquals": {
                    "oidc.eks/id/X:sub": "system:serviceaccount:serving:llama",
                    "oidc.eks/id/X:aud": "sts.amazonaws.com",
                }
            }
        )
    }
    assert check_irsa_trust_scoped("aws:iam/role:Role", props) == []


@pytest.mark.parametrize(
    "condition",
    [
        {},
        {"StringLike": {"oidc.eks/id/X:sub": "system:serviceaccount:*"}},
        {"StringEquals": {"oidc.eks/id/X:sub": "system:serviceaccount:serving:*"}},
    ],
)
def test_irsa_trust_not_pinned_fails(condition: dict[str, object]) -> None:
    assert check_irsa_trust_scoped("aws:iam/role:Role", {"assumeRolePolicy": trust(condition)})


def test_non_irsa_role_and_unknown_policy_are_ignored() -> None:
    ec2 = json.dumps(
        {
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "sts:AssumeRole",
                    "Principal": {"Service": "ec2.amazonaws.com"},
                }
            ]
        }
    )
    assert check_irsa_trust_scoped("aws:iam/role:Role", {"assumeRolePolicy": ec2}) == []
    assert check_irsa_trust_scoped("aws:iam/role:Role", {}) == []


def s3_policy(*statements: dict[str, object]) -> dict[str, str]:
    return {"policy": json.dumps({"Version": "2012-10-17", "Statement": list(statements)})}


def test_s3_access_under_model_prefix_passes() -> None:
    props = s3_policy(
        {
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": ["arn:aws:s3:::models-use1/models/llama/*"],
        },
        {
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": "arn:aws:s3:::models-use1",
            "Condition": {"StringLike": {"s3:prefix": ["models/llama/*"]}},
        },
        {"Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
    )
    assert check_s3_access_scoped_to_prefix("aws:iam/rolePolicy:RolePolicy", props) == []


@pytest.mark.parametrize(
    "statement",
    [
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"},
        {"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:s3:::models-use1/*"},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::models-use1"},
        {"Effect": "Allow", "Action": "*", "Resource": "arn:aws:s3:::models-*/models/x/*"},
        # A configuration read does not excuse an object read on the whole bucket.
        {
            "Effect": "Allow",
            "Action": ["s3:GetReplicationConfiguration", "s3:GetObject"],
            "Resource": "arn:aws:s3:::models-use1",
        },
    ],
)
def test_unscoped_s3_access_fails(statement: dict[str, object]) -> None:
    messages = check_s3_access_scoped_to_prefix("aws:iam/policy:Policy", s3_policy(statement))
    assert len(messages) == 1 and "prefix" in messages[0]


def test_bucket_configuration_reads_need_no_prefix() -> None:
    # S3 replication reads the source bucket's replication configuration at bucket level.
    props = s3_policy(
        {
            "Effect": "Allow",
            "Action": ["s3:GetReplicationConfiguration", "s3:GetBucketVersioning"],
            "Resource": "arn:aws:s3:::models-use1",
        }
    )
    assert check_s3_access_scoped_to_prefix("aws:iam/rolePolicy:RolePolicy", props) == []


LIST_WITH_LOCATION = {
    "Effect": "Allow",
    "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
    "Resource": "arn:aws:s3:::models-use1",
}


def test_scoped_listing_with_bucket_location_passes() -> None:
    scoped = {**LIST_WITH_LOCATION, "Condition": {"StringLike": {"s3:prefix": ["models/llama/*"]}}}
    props = s3_policy(scoped)
    assert check_s3_access_scoped_to_prefix("aws:iam/rolePolicy:RolePolicy", props) == []


@pytest.mark.parametrize(
    "condition",
    [None, {"StringLike": {"s3:prefix": ["*"]}}, {"StringEquals": {"s3:delimiter": "/"}}],
)
def test_unscoped_listing_with_bucket_location_fails(condition: dict[str, object] | None) -> None:
    statement = dict(LIST_WITH_LOCATION)
    if condition is not None:
        statement["Condition"] = condition
    messages = check_s3_access_scoped_to_prefix("aws:iam/policy:Policy", s3_policy(statement))
    assert len(messages) == 1 and "'arn:aws:s3:::models-use1'" in messages[0]


WIDE_SUB = {"StringLike": {"oidc.eks/id/X:sub": "system:serviceaccount:*:*"}}


@pytest.mark.parametrize(
    "action",
    [
        "sts:*",
        "*",
        "sts:assumerolewithwebidentity",
        "sts:AssumeRole*",
        "sts:AssumeRoleWith?ebIdentity",
    ],
)
def test_irsa_trust_checked_for_every_action_spelling(action: str) -> None:
    document = json.loads(trust(WIDE_SUB))
    document["Statement"][0]["Action"] = [action]
    props = {"assumeRolePolicy": json.dumps(document)}
    assert check_irsa_trust_scoped("aws:iam/role:Role", props)


def test_irsa_trust_checked_for_not_action() -> None:
    document = json.loads(trust(WIDE_SUB))
    del document["Statement"][0]["Action"]
    document["Statement"][0]["NotAction"] = "sts:TagSession"
    props = {"assumeRolePolicy": json.dumps(document)}
    assert check_irsa_trust_scoped("aws:iam/role:Role", props)


def test_irsa_trust_of_two_service_accounts_fails() -> None:
    pinned = {
        "StringEquals": {
            "oidc.eks/id/X:sub": ["system:serviceaccount:a:one", "system:serviceaccount:b:two"]
        }
    }
    messages = check_irsa_trust_scoped("aws:iam/role:Role", {"assumeRolePolicy": trust(pinned)})
    assert len(messages) == 1 and "2 service accounts" in messages[0]


def test_service_principal_with_wide_sts_action_is_not_irsa() -> None:
    node = json.dumps(
        {
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "sts:*",
                    "Principal": {"Service": "ec2.amazonaws.com"},
                }
            ]
        }
    )
    assert check_irsa_trust_scoped("aws:iam/role:Role", {"assumeRolePolicy": node}) == []


@pytest.mark.parametrize(
    "statement",
    [
        {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"},
        {"Effect": "Allow", "Action": "s3:*", "NotResource": "arn:aws:s3:::models-use1/x/*"},
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": "arn:aws:s3:::models-use1",
            "Condition": {"StringLike": {"s3:prefix": "*"}},
        },
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": "arn:aws:s3:::models-use1",
            "Condition": {"StringLike": {"s3:prefix": ["models/llama/*", "*/llama/"]}},
        },
        {
            "Effect": "Allow",
            "Action": "s3:GetObject",
            "Resource": "arn:aws:s3:::models-use1/??????/*",
        },
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::models-us??/m/x/*"},
    ],
)
def test_s3_wildcards_and_negations_fail(statement: dict[str, object]) -> None:
    messages = check_s3_access_scoped_to_prefix("aws:iam/policy:Policy", s3_policy(statement))
    assert len(messages) == 1 and "prefix" in messages[0]


def test_s3_not_action_excluding_all_of_s3_passes() -> None:
    props = s3_policy({"Effect": "Allow", "NotAction": ["s3:*", "iam:*"], "Resource": "*"})
    assert check_s3_access_scoped_to_prefix("aws:iam/policy:Policy", props) == []


def test_role_inline_policies_are_checked() -> None:
    scoped = s3_policy(
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::m/models/x/*"}
    )
    wide = s3_policy({"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::m/*"})
    props = {"inlinePolicies": [{"name": "ok", **scoped}, {"name": "wide", **wide}]}
    messages = check_s3_access_scoped_to_prefix("aws:iam/role:Role", props)
    assert len(messages) == 1 and "'arn:aws:s3:::m/*'" in messages[0]


@pytest.mark.parametrize(
    "operator",
    ["StringNotLike", "StringNotEquals", "StringLikeIfExists", "ForAllValues:StringLike"],
)
def test_listing_conditions_that_pass_a_listing_without_prefix_fail(operator: str) -> None:
    # Each lets `aws s3 ls s3://models-use1` (no s3:prefix) through: the whole bucket.
    condition = {operator: {"s3:prefix": ["secrets/"]}}
    messages = check_s3_access_scoped_to_prefix(
        "aws:iam/policy:Policy", s3_policy({**LIST_WITH_LOCATION, "Condition": condition})
    )
    assert len(messages) == 1 and "'arn:aws:s3:::models-use1'" in messages[0]


def test_listing_scoped_by_for_any_value_passes() -> None:
    condition = {"ForAnyValue:StringEquals": {"s3:prefix": ["models/llama/"]}}
    props = s3_policy({**LIST_WITH_LOCATION, "Condition": condition})
    assert check_s3_access_scoped_to_prefix("aws:iam/policy:Policy", props) == []


@pytest.mark.parametrize(
    "federated",
    [
        "arn:aws:iam::1:oidc-provider/token.actions.githubusercontent.com",
        "cognito-identity.amazonaws.com",
    ],
)
def test_web_identity_roles_of_other_providers_are_not_irsa(federated: str) -> None:
    # A GitHub Actions deploy role pins the repository, not a service account.
    document = json.loads(trust({"StringEquals": {"x:sub": "repo:acme/llm-serving:ref:main"}}))
    document["Statement"][0]["Principal"] = {"Federated": federated}
    props = {"assumeRolePolicy": json.dumps(document)}
    assert check_irsa_trust_scoped("aws:iam/role:Role", props) == []


@pytest.mark.parametrize(
    "federated",
    [
        ["arn:aws:iam::1:oidc-provider/token.actions.githubusercontent.com", EKS_PROVIDER],
        "arn:aws:iam::1:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/ABC",
        "arn:aws:iam::1:oidc-provider/oidc.eks.cn-north-1.amazonaws.com.cn/id/ABC",
        "arn:aws:mock:::cluster-oidc",  # not recognisably another provider: checked
    ],
)
def test_a_principal_that_may_be_an_eks_provider_is_irsa(federated: str | list[str]) -> None:
    document = json.loads(trust(WIDE_SUB))
    document["Statement"][0]["Principal"] = {"Federated": federated}
    props = {"assumeRolePolicy": json.dumps(document)}
    assert check_irsa_trust_scoped("aws:iam/role:Role", props)


def test_other_services_resources_beside_scoped_objects_pass() -> None:
    # Reading SSE-KMS model objects takes kms:Decrypt on the key, often in the same statement.
    key = "arn:aws:kms:us-east-1:1:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    statement = {
        "Effect": "Allow",
        "Action": ["s3:GetObject", "kms:Decrypt"],
        "Resource": ["arn:aws:s3:::models-use1/models/llama/*", key],
    }
    assert check_s3_access_scoped_to_prefix("aws:iam/policy:Policy", s3_policy(statement)) == []


@pytest.mark.parametrize("resource", ["*", "arn:aws:*", "arn:*:s3:::models-use1/*"])
def test_wildcard_resources_that_may_name_s3_fail(resource: str) -> None:
    statement = {"Effect": "Allow", "Action": ["s3:GetObject", "kms:Decrypt"], "Resource": resource}
    messages = check_s3_access_scoped_to_prefix("aws:iam/policy:Policy", s3_policy(statement))
    assert len(messages) == 1 and repr(resource) in messages[0]
