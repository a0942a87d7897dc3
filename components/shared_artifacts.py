"""``SharedArtifacts``: what all regions share, owned by the ``global`` stack.

The serving image repository lives in the publishing region and ECR replicates it to every
other region; each region gets its own model bucket, filled by S3 replication from the
publishing region's bucket, so servers and the FSx cache only ever read in-region.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.iam import role_name, service_trust_policy

__all__ = ["MODEL_PREFIX", "SharedArtifacts", "SharedArtifactsArgs"]

MODEL_PREFIX = "models/"


@dataclass(frozen=True)
class SharedArtifactsArgs:
    """Inputs of the shared artifacts."""

    publishing_region: str
    """Region that images are pushed to and models published in."""
    replica_regions: Sequence[str]
    """Regions that receive replicas."""
    image_repository: str
    """ECR repository name of the serving image, in a namespace (``llm-serving/triton-vllm``):
    ECR applies settings to the repositories replication creates by namespace."""


class SharedArtifacts(pulumi.ComponentResource):
    """An ECR repository with cross-region replication and replicated model buckets."""

    image_repository_urls: dict[str, pulumi.Output[str]]
    model_buckets: dict[str, pulumi.Output[str]]

    def __init__(
        self, name: str, args: SharedArtifactsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        if args.publishing_region in args.replica_regions or not args.replica_regions:
            raise ValueError(
                "replica_regions must list at least one region other than the publishing region"
            )
        namespace, slash, _ = args.image_repository.rpartition("/")
        if not slash or not namespace:
            raise ValueError(
                f"image_repository {args.image_repository!r} has no namespace; name it "
                "<namespace>/<name> (e.g. llm-serving/triton-vllm): the replicas' settings "
                "apply by namespace"
            )
        super().__init__("llm-serving:shared_artifacts:SharedArtifacts", name, None, opts)
        self._name = name
        self._versioning: list[aws.s3.BucketVersioning] = []
        account = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self))
        repository = aws.ecr.Repository(
            f"{name}-image",
            name=args.image_repository,
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(
                scan_on_push=True
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        # Replication creates each replica repository with ECR's defaults (mutable tags), and
        # region stacks pull the replicas by tag: a creation template per replica region makes
        # them immutable like the source. It must exist before replication first creates them.
        templates = [
            aws.ecr.RepositoryCreationTemplate(
                f"{name}-image-replica-{region}",
                region=region,
                prefix=namespace,
                applied_fors=["REPLICATION"],
                description="replicas of the llm-serving image: immutable tags, as the source",
                image_tag_mutability="IMMUTABLE",
                encryption_configurations=[
                    aws.ecr.RepositoryCreationTemplateEncryptionConfigurationArgs(
                        encryption_type="AES256"
                    )
                ],
                opts=pulumi.ResourceOptions(parent=repository),
            )
            for region in args.replica_regions
        ]
        # The replication configuration is registry-wide: this stack owns the account's in the
        # publishing region.
        aws.ecr.ReplicationConfiguration(
            f"{name}-image-replication",
            replication_configuration=aws.ecr.ReplicationConfigurationReplicationConfigurationArgs(
                rules=[
                    aws.ecr.ReplicationConfigurationReplicationConfigurationRuleArgs(
                        destinations=[
                            aws.ecr.ReplicationConfigurationReplicationConfigurationRuleDestinationArgs(
                                region=region, registry_id=account.account_id
                            )
                            for region in args.replica_regions
                        ],
                        repository_filters=[
                            aws.ecr.ReplicationConfigurationReplicationConfigurationRuleRepositoryFilterArgs(
                                filter=args.image_repository, filter_type="PREFIX_MATCH"
                            )
                        ],
                    )
                ]
            ),
            opts=pulumi.ResourceOptions(parent=repository, depends_on=templates),
        )
        self.image_repository_urls = {
            region: pulumi.Output.concat(
                account.account_id, f".dkr.ecr.{region}.amazonaws.com/{args.image_repository}"
            )
            for region in (args.publishing_region, *args.replica_regions)
        }
        buckets = {
            region: self._bucket(region)
            for region in (args.publishing_region, *args.replica_regions)
        }
        self._replicate(buckets, args.publishing_region)
        self.model_buckets = {region: bucket.bucket for region, bucket in buckets.items()}
        self.register_outputs(
            {
                "image_repository_urls": self.image_repository_urls,
                "model_buckets": self.model_buckets,
            }
        )

    def _bucket(self, region: str) -> aws.s3.Bucket:
        bucket = aws.s3.Bucket(
            f"{self._name}-models-{region}",
            region=region,
            opts=pulumi.ResourceOptions(parent=self, protect=True),
        )
        child = pulumi.ResourceOptions(parent=bucket)
        aws.s3.BucketPublicAccessBlock(
            f"{self._name}-models-{region}-private",
            bucket=bucket.id,
            region=region,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        self._versioning.append(
            aws.s3.BucketVersioning(
                f"{self._name}-models-{region}-versioning",
                bucket=bucket.id,
                region=region,
                versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(
                    status="Enabled"
                ),
                opts=child,
            )
        )
        # SSE-S3 rather than KMS keeps replication free of per-region key grants.
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{self._name}-models-{region}-encryption",
            bucket=bucket.id,
            region=region,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="AES256"
                    ),
                    bucket_key_enabled=True,
                )
            ],
            opts=child,
        )
        return bucket

    def _replicate(self, buckets: dict[str, aws.s3.Bucket], source_region: str) -> None:
        source = buckets[source_region]
        replicas = {r: b for r, b in buckets.items() if r != source_region}
        role = aws.iam.Role(
            f"{self._name}-replication-role",
            name=role_name(f"{self._name}-replication-role"),
            assume_role_policy=service_trust_policy("s3.amazonaws.com"),
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.iam.RolePolicy(
            f"{self._name}-replication-policy",
            role=role.id,
            policy=pulumi.Output.all(source.arn, *[b.arn for b in replicas.values()]).apply(
                lambda arns: json.dumps(_replication_policy(arns[0], arns[1:]))
            ),
            opts=pulumi.ResourceOptions(parent=role),
        )
        aws.s3.BucketReplicationConfig(
            f"{self._name}-models-replication",
            bucket=source.id,
            region=source_region,
            role=role.arn,
            rules=[
                aws.s3.BucketReplicationConfigRuleArgs(
                    id=f"models-to-{region}",
                    priority=priority,
                    status="Enabled",
                    filter=aws.s3.BucketReplicationConfigRuleFilterArgs(prefix=MODEL_PREFIX),
                    delete_marker_replication=aws.s3.BucketReplicationConfigRuleDeleteMarkerReplicationArgs(
                        status="Enabled"
                    ),
                    destination=aws.s3.BucketReplicationConfigRuleDestinationArgs(
                        bucket=bucket.arn, storage_class="STANDARD"
                    ),
                )
                for priority, (region, bucket) in enumerate(sorted(replicas.items()))
            ],
            # S3 refuses replication rules until versioning is on at both ends.
            opts=pulumi.ResourceOptions(parent=source, depends_on=self._versioning),
        )


def _replication_policy(source: str, destinations: Sequence[str]) -> dict[str, object]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": ["s3:GetReplicationConfiguration"], "Resource": [source]},
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [source],
                "Condition": {"StringLike": {"s3:prefix": [f"{MODEL_PREFIX}*"]}},
            },
            {
                "Effect": "Allow",
                "Action": [
                    "s3:GetObjectVersionForReplication",
                    "s3:GetObjectVersionAcl",
                    "s3:GetObjectVersionTagging",
                ],
                "Resource": [f"{source}/{MODEL_PREFIX}*"],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:ReplicateObject", "s3:ReplicateDelete", "s3:ReplicateTags"],
                "Resource": [f"{d}/{MODEL_PREFIX}*" for d in destinations],
            },
        ],
    }
