"""Launch-template settings that every node group of the platform shares."""

from __future__ import annotations

import pulumi_aws as aws

__all__ = ["encrypted_root_volume", "imdsv2_only"]


def imdsv2_only() -> aws.ec2.LaunchTemplateMetadataOptionsArgs:
    """IMDSv2 with a hop limit of 1, which keeps pods (they use IRSA) away from the node role."""
    return aws.ec2.LaunchTemplateMetadataOptionsArgs(
        http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1
    )


def encrypted_root_volume(
    device_name: str, size_gib: int
) -> list[aws.ec2.LaunchTemplateBlockDeviceMappingArgs]:
    """An encrypted gp3 root volume of ``size_gib``, deleted with its instance."""
    return [
        aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
            device_name=device_name,
            ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                volume_size=size_gib,
                volume_type="gp3",
                encrypted="true",
                delete_on_termination="true",
            ),
        )
    ]
