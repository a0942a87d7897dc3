"""SharedArtifacts: ECR replicated to every region, model buckets replicated from the publisher."""

from __future__ import annotations

import json

import pytest

from components.shared_artifacts import MODEL_PREFIX, SharedArtifacts, SharedArtifactsArgs
from tests.components.declared import Declare

REPLICAS = ["eu-west-1", "ap-northeast-1"]


def test_image_and_models_replicate_to_every_region(declare: Declare) -> None:
    made: list[SharedArtifacts] = []
    declared = declare(
        lambda: made.append(
            SharedArtifacts(
                "global",
                SharedArtifactsArgs(
                    publishing_region="us-east-1",
                    replica_regions=REPLICAS,
                    image_repository="llm/serving",
                ),
            )
        )
    )
    assert declared.one("aws:ecr/repository:Repository").inputs["imageTagMutability"] == (
        "IMMUTABLE"
    )
    rules = declared.one("aws:ecr/replicationConfiguration:ReplicationConfiguration").inputs[
        "replicationConfiguration"
    ]["rules"]
    assert [d["region"] for d in rules[0]["destinations"]] == REPLICAS
    assert rules[0]["repositoryFilters"] == [
        {"filter": "llm/serving", "filterType": "PREFIX_MATCH"}
    ]
    buckets = {b.inputs["region"]: b for b in declared.of_type("aws:s3/bucket:Bucket")}
    assert set(buckets) == {"us-east-1", *REPLICAS}
    versioning = declared.of_type("aws:s3/bucketVersioning:BucketVersioning")
    assert {v.inputs["versioningConfiguration"]["status"] for v in versioning} == {"Enabled"}
    replication = declared.one("aws:s3/bucketReplicationConfig:BucketReplicationConfig")
    assert replication.inputs["bucket"] == f"{buckets['us-east-1'].name}-id"
    destinations = {r["destination"]["bucket"] for r in replication.inputs["rules"]}
    assert destinations == {f"arn:aws:s3:::{buckets[r].name}-bucket" for r in REPLICAS}
    assert {r["filter"]["prefix"] for r in replication.inputs["rules"]} == {MODEL_PREFIX}
    assert {v.urn for v in versioning} <= set(replication.dependencies)
    policy = json.loads(declared.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    written = policy["Statement"][2]["Resource"]
    assert all(r.endswith(f"/{MODEL_PREFIX}*") for r in written)
    urls = made[0].image_repository_urls
    assert set(urls) == {"us-east-1", *REPLICAS}


def _shared(image_repository: str = "llm/serving") -> SharedArtifacts:
    return SharedArtifacts(
        "global",
        SharedArtifactsArgs(
            publishing_region="us-east-1",
            replica_regions=REPLICAS,
            image_repository=image_repository,
        ),
    )


def test_replica_repositories_are_created_with_immutable_tags(declare: Declare) -> None:
    # Region stacks pull the replicas by tag; replication alone would create them mutable.
    declared = declare(_shared)
    templates = declared.of_type("aws:ecr/repositoryCreationTemplate:RepositoryCreationTemplate")
    assert sorted(t.inputs["region"] for t in templates) == sorted(REPLICAS)
    for template in templates:
        assert template.inputs["prefix"] == "llm"
        assert template.inputs["appliedFors"] == ["REPLICATION"]
        assert template.inputs["imageTagMutability"] == "IMMUTABLE"
    replication = declared.one("aws:ecr/replicationConfiguration:ReplicationConfiguration")
    assert {t.urn for t in templates} <= set(replication.dependencies)


def test_an_image_repository_without_a_namespace_is_refused() -> None:
    with pytest.raises(ValueError, match="has no namespace; name it <namespace>/<name>"):
        _shared("serving")
