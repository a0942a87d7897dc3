"""ModelCache: encrypted PERSISTENT_2 Lustre, import-only association, Lustre-port SG, claims."""

from __future__ import annotations

import pytest

from components.gpu_node_group import NODE_GROUP_LABEL, gpu_tolerations
from components.model_cache import (
    CACHE_MOUNT_PATH,
    CSI_DRIVER,
    ModelCache,
    ModelCacheArgs,
)
from tests.components.declared import Declare, Declared

VERSIONS = [("llama", "v1"), ("ranker", "2026.11")]


def _args(**overrides: object) -> ModelCacheArgs:
    values: dict[str, object] = {
        "vpc_id": "vpc-1",
        "subnet_id": "subnet-1",
        "node_security_group_id": "sg-nodes",
        "bucket_name": "models-use1",
        "namespace": "serving",
        "versions": VERSIONS,
        "serving_image": "serving:1",
        "client_node_groups": ["r-h100", "r-l40s"],
        "throughput_per_unit": 500,
        "verify_jobs": 4,
    }
    values.update(overrides)
    return ModelCacheArgs(**values)  # type: ignore[arg-type]


@pytest.fixture
def declared(declare: Declare) -> Declared:
    return declare(lambda: ModelCache("cache", _args()))


def test_file_system_is_persistent_2_and_kms_encrypted(declared: Declared) -> None:
    fs = declared.one("aws:fsx/lustreFileSystem:LustreFileSystem").inputs
    key = declared.one("aws:kms/key:Key")
    assert fs["deploymentType"] == "PERSISTENT_2"
    assert fs["perUnitStorageThroughput"] == 500
    assert fs["kmsKeyId"] == f"arn:aws:mock:::{key.name}"
    assert key.inputs["enableKeyRotation"] is True


def test_file_system_waits_for_every_rule_of_its_security_group(declared: Declared) -> None:
    # FSx refuses CreateFileSystem (InvalidNetworkSettings) while the group does not yet admit
    # Lustre on 988 and 1018-1023; pulumi-aws creates the group without any rule.
    fs = declared.one("aws:fsx/lustreFileSystem:LustreFileSystem")
    group = declared.one("aws:ec2/securityGroup:SecurityGroup")
    rules = [
        r
        for r in declared.run.resources
        if r.type.startswith("aws:vpc/securityGroup") and r.parent == group.urn
    ]
    assert len(rules) == 6  # ingress from the nodes and the servers, egress to the servers
    missing = [r.name for r in rules if r.urn not in fs.dependencies]
    assert missing == [], f"the file system does not wait for {missing}"


def test_file_system_is_protected_against_replacement_and_deletion(declared: Declared) -> None:
    # Replacing it would empty the cache and move the volume handle of the bound static PVs.
    fs = declared.one("aws:fsx/lustreFileSystem:LustreFileSystem")
    assert fs.options.get("protect") is True
    assert fs.inputs["subnetIds"] == "subnet-1"


def test_association_imports_only_from_the_models_prefix(declared: Declared) -> None:
    association = declared.one("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    inputs = association.inputs
    assert inputs["dataRepositoryPath"] == "s3://models-use1/models/"
    assert inputs["fileSystemPath"] == "/models"
    assert inputs["s3"]["autoImportPolicy"]["events"] == ["NEW", "CHANGED", "DELETED"]
    assert "autoExportPolicy" not in inputs["s3"]
    assert inputs["deleteDataInFilesystem"] is False


def test_lustre_ports_open_only_to_nodes_and_servers(declared: Declared) -> None:
    group = declared.one("aws:ec2/securityGroup:SecurityGroup")
    rules = declared.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    assert {(r.inputs["fromPort"], r.inputs["toPort"]) for r in rules} == {(988, 988), (1018, 1023)}
    sources = {r.inputs["referencedSecurityGroupId"] for r in rules}
    assert sources == {"sg-nodes", f"{group.name}-id"}
    assert all("cidrIpv4" not in r.inputs for r in rules)
    assert all(r.inputs["ipProtocol"] == "tcp" for r in rules)


def test_static_volume_and_read_only_claim(declared: Declared) -> None:
    fs = declared.one("aws:fsx/lustreFileSystem:LustreFileSystem")
    volumes = {v["metadata"]["name"]: v for v in declared.kubernetes("PersistentVolume")}
    claims = {c["metadata"]["name"]: c for c in declared.kubernetes("PersistentVolumeClaim")}
    reader = claims["cache-read-only"]
    volume = volumes[reader["spec"]["volumeName"]]
    csi = volume["spec"]["csi"]
    assert csi["driver"] == CSI_DRIVER
    assert csi["volumeHandle"] == f"{fs.name}-id"
    assert csi["volumeAttributes"] == {
        "dnsname": f"{fs.name}.fsx.mock.amazonaws.com",
        "mountname": "abcdefgh",
    }
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"


# Kubernetes access modes behind the only capabilities fsx.csi.aws.com accepts (volumeCaps in
# the driver's controller.go: SINGLE_NODE_WRITER, MULTI_NODE_MULTI_WRITER); any other mode
# fails NodePublishVolume with "Volume capability not supported".
FSX_DRIVER_MODES = {"ReadWriteOnce", "ReadWriteMany"}


def test_claims_use_access_modes_the_fsx_driver_mounts(declared: Declared) -> None:
    volumes = declared.kubernetes("PersistentVolume")
    claims = declared.kubernetes("PersistentVolumeClaim")
    assert len(volumes) == len(claims) == 2
    for item in (*volumes, *claims):
        assert set(item["spec"]["accessModes"]) <= FSX_DRIVER_MODES, item["metadata"]["name"]
        # Pods on many nodes mount the cache at once.
        assert "ReadWriteMany" in item["spec"]["accessModes"], item["metadata"]["name"]


def test_readers_mount_lustre_read_only_and_the_restore_claim_writes(
    declared: Declared,
) -> None:
    volumes = {v["metadata"]["name"]: v for v in declared.kubernetes("PersistentVolume")}
    claims = {c["metadata"]["name"]: c for c in declared.kubernetes("PersistentVolumeClaim")}
    reader = volumes[claims["cache-read-only"]["spec"]["volumeName"]]
    writer = volumes[claims["cache-restore"]["spec"]["volumeName"]]
    # The access mode no longer keeps readers from writing: the Lustre mount itself is ro.
    assert "ro" in reader["spec"]["mountOptions"]
    assert "ro" not in writer["spec"]["mountOptions"]
    assert reader["spec"]["csi"]["volumeHandle"] == writer["spec"]["csi"]["volumeHandle"]


def test_one_materialize_job_per_version_after_the_association(declared: Declared) -> None:
    association = declared.one("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    jobs = declared.of_type("kubernetes:batch/v1:Job")
    assert len(jobs) == len(VERSIONS)
    for (model_id, version), job in zip(VERSIONS, sorted(jobs, key=lambda j: j.name), strict=True):
        assert association.urn in job.dependencies
        (container,) = job.inputs["spec"]["template"]["spec"]["containers"]
        command = container["command"]
        assert command[-3:] == ["--jobs", "4", f"{CACHE_MOUNT_PATH}/models/{model_id}/{version}"]
        claim = job.inputs["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]
        assert claim["claimName"] == "cache-restore"


def test_materialize_jobs_run_on_the_lustre_client_nodes(declared: Declared) -> None:
    # Only the nodes in node_security_group_id reach the Lustre ports, and they are tainted.
    for job in declared.of_type("kubernetes:batch/v1:Job"):
        pod = job.inputs["spec"]["template"]["spec"]
        assert pod["tolerations"] == gpu_tolerations()
        required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert required["nodeSelectorTerms"] == [
            {
                "matchExpressions": [
                    {"key": NODE_GROUP_LABEL, "operator": "In", "values": ["r-h100", "r-l40s"]}
                ]
            }
        ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"throughput_per_unit": 300}, "expected one of: 125, 250, 500, 1000"),
        ({"storage_capacity_gib": 3000}, "1200 or a multiple of 2400"),
        ({"verify_jobs": 0}, "verify_jobs must be at least 1, got 0"),
        ({"versions": [("a", "1"), ("a", "1")]}, "twice"),
        ({"client_node_groups": []}, "client_node_groups"),
    ],
)
def test_bad_args_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelCache("bad", _args(**overrides))
