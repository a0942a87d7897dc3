"""A created EKS cluster: its public API endpoint admits only the listed ranges, and its EBS CSI
add-on runs on an IRSA role trusting the add-on's one service account."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import pulumi
import pytest

from components.eks_cluster import (
    EBS_CSI_POLICY,
    PUBLIC_ACCESS_CIDRS_LIMIT,
    ClusterArgs,
    check_public_access_cidrs,
    create_cluster,
    create_ebs_csi_driver,
)
from policy.aws import check_irsa_trust_scoped
from tests.components.declared import Declare, Declared

CLUSTER = "aws:eks/cluster:Cluster"
ADDON = "aws:eks/addon:Addon"
ROLE = "aws:iam/role:Role"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"


def _cluster(declare: Declare, cidrs: Sequence[str], with_driver: bool = False) -> Declared:
    def program() -> None:
        parent = pulumi.ComponentResource("test:index:Region", "r")
        args = ClusterArgs(
            name="c", version="1.33", subnet_ids=["subnet-1"], public_access_cidrs=cidrs
        )
        cluster = create_cluster("r", args, parent)
        if with_driver:
            nodes = pulumi.CustomResource("test:index:Nodes", "system")
            create_ebs_csi_driver("r", cluster, [nodes], parent)

    return declare(program)


def test_the_public_endpoint_admits_only_the_listed_ranges(declare: Declare) -> None:
    vpc = _cluster(declare, ["5.6.7.0/24", "9.9.9.9/32"]).one(CLUSTER).inputs["vpcConfig"]
    assert vpc["endpointPublicAccess"] is True
    assert vpc["publicAccessCidrs"] == ["5.6.7.0/24", "9.9.9.9/32"]
    # Nodes reach the API privately whatever the public endpoint admits.
    assert vpc["endpointPrivateAccess"] is True


def test_no_ranges_leave_the_private_endpoint_only(declare: Declare) -> None:
    vpc = _cluster(declare, []).one(CLUSTER).inputs["vpcConfig"]
    assert vpc["endpointPublicAccess"] is False
    assert "publicAccessCidrs" not in vpc
    assert vpc["endpointPrivateAccess"] is True


@pytest.mark.parametrize(
    ("cidrs", "problem"),
    [
        (["5.6.7.1/24"], "5.6.7.1/24 has host bits set; write 5.6.7.0/24 for the range or "),
        (["5.6.7.8"], "5.6.7.8 is an address; write 5.6.7.8/32"),
        (["::/0"], "'::/0' is not an IPv4 range"),
        (["5.6.7.0/33"], "'5.6.7.0/33' is not an IPv4 range"),
        (["10.0.0.0/8"], "10.0.0.0/8 is a private or reserved range, which EKS refuses"),
        (["5.6.7.0/24", "5.6.7.0/24"], "5.6.7.0/24 listed twice"),
        (["0.0.0.0/0", "5.6.7.0/24"], "0.0.0.0/0 admits every address"),
        (
            [f"5.6.{i}.0/24" for i in range(PUBLIC_ACCESS_CIDRS_LIMIT + 1)],
            "41 ranges; EKS admits at most 40",
        ),
    ],
)
def test_ranges_eks_would_refuse_or_that_mislead_are_refused(
    cidrs: list[str], problem: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        check_public_access_cidrs(cidrs)


def test_a_created_cluster_refuses_a_bad_range(declare: Declare) -> None:
    with pytest.raises(ValueError, match="private or reserved"):
        _cluster(declare, ["192.168.0.0/16"])


def test_the_ebs_csi_add_on_runs_on_a_role_trusting_its_service_account(declare: Declare) -> None:
    declared = _cluster(declare, ["0.0.0.0/0"], with_driver=True)
    addon = declared.one(ADDON)
    role = declared.one(ROLE, "ebs-csi")
    attachment = declared.one(ATTACHMENT, "ebs-csi")
    assert addon.inputs["addonName"] == "aws-ebs-csi-driver"
    assert addon.inputs["clusterName"] == "c"
    assert addon.inputs["serviceAccountRoleArn"] == f"arn:aws:mock:::{role.name}"
    assert attachment.inputs["policyArn"] == EBS_CSI_POLICY
    # Its controller needs the policy, and nodes to run on before EKS reports it active.
    assert {attachment.urn, declared.one("test:index:Nodes").urn} <= set(addon.dependencies)
    trust = json.loads(role.inputs["assumeRolePolicy"])
    (statement,) = trust["Statement"]
    issuer = "oidc.eks.mock.amazonaws.com/id/r-cluster"
    assert statement["Condition"]["StringEquals"] == {
        f"{issuer}:sub": "system:serviceaccount:kube-system:ebs-csi-controller-sa",
        f"{issuer}:aud": "sts.amazonaws.com",
    }
    assert statement["Principal"]["Federated"] == "arn:aws:mock:::r-oidc"
    assert check_irsa_trust_scoped(ROLE, role.inputs) == []
