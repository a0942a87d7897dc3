"""``ModelCache``: FSx for Lustre linked to the model bucket, and the jobs that fill it.

Importing from S3 brings only metadata, so each model version in service gets a materialize
Job: a container of the serving image reads every file of the version, many at once, and hashes
it against the version's manifest.json. FSx loads a file's contents from the bucket when it is
first read (https://docs.aws.amazon.com/fsx/latest/LustreGuide/importing-files-dra.html), so
that one pass both fills the cache and checks it, with no Lustre tool and no privilege. Servers
of that version depend on the Job, so no GPU pod ever starts by pulling weights from S3, nor
from a cache copy whose bytes nobody checked (stage 1 of the entrypoint checks only sizes
there). The Jobs run on the GPU node groups: only their security group may reach the Lustre
ports.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.gpu_node_group import NODE_GROUP_LABEL, gpu_tolerations
from contracts.labels import MODEL_ID_LABEL, MODEL_VERSION_LABEL
from contracts.naming import dns_label

__all__ = [
    "ACCESS_MODE",
    "CACHE_MOUNT_PATH",
    "CSI_DRIVER",
    "FILE_SYSTEM_PATH",
    "LUSTRE_PORTS",
    "ModelCache",
    "ModelCacheArgs",
    "verify_command",
]

CSI_DRIVER = "fsx.csi.aws.com"
# The only multi-node mode the driver supports (MULTI_NODE_MULTI_WRITER in its volumeCaps).
ACCESS_MODE = "ReadWriteMany"
CACHE_MOUNT_PATH = "/mnt/model-cache"
# The association links bucket prefix ``models/`` to this path (contract 5).
FILE_SYSTEM_PATH = "/models"
# Lustre clients reach the servers on 988 and 1018-1023 (FSx for Lustre VPC requirements).
LUSTRE_PORTS = ((988, 988), (1018, 1023))
THROUGHPUT_PER_UNIT = (125, 250, 500, 1000)
# The verify_jobs threads mostly wait on FSx loading their files from S3; bytes already in Lustre
# make hashing CPU-bound, paced by the limit's two cores. Memory holds one 1 MiB read buffer per
# thread (16 MiB at the default 16 jobs), plugin wheels and catalogs.
VERIFY_RESOURCES = {
    "requests": {"cpu": "1", "memory": "1Gi"},
    "limits": {"cpu": "2", "memory": "4Gi"},
}


@dataclass(frozen=True)
class ModelCacheArgs:
    """Inputs of the model cache."""

    vpc_id: pulumi.Input[str]
    """VPC of the file system and the GPU nodes."""
    subnet_id: pulumi.Input[str]
    """The one subnet a PERSISTENT_2 file system lives in. Changing it would replace the file
    system, which is protected: such an update fails until it is unprotected."""
    node_security_group_id: pulumi.Input[str]
    """Security group of the GPU nodes: the only clients allowed on the Lustre ports."""
    bucket_name: pulumi.Input[str]
    """The region's model bucket (``models/<id>/<version>/...``)."""
    namespace: str
    """Kubernetes namespace of the claims and materialize jobs."""
    versions: Sequence[tuple[str, str]]
    """``(model_id, version)`` pairs in service: one materialize Job each."""
    serving_image: pulumi.Input[str]
    """The image the model servers run: its ``package verify`` loads and checks each version
    with the same code stage 1 of the entrypoint would."""
    client_node_groups: Sequence[str]
    """``llm-serving/node-group`` labels of the nodes in ``node_security_group_id``: the
    materialize Jobs run there, tolerating their GPU taint."""
    storage_capacity_gib: int = 2400
    """File system size: 1200 or a multiple of 2400 GiB."""
    throughput_per_unit: int = 250
    """MB/s per TiB, one of :data:`THROUGHPUT_PER_UNIT`."""
    verify_jobs: int = 16
    """Files a materialize Job reads at once: FSx loads them from S3 in parallel."""
    restore_timeout_s: int = 3600
    """How long a materialize Job, loading and verifying the version, may take before it
    fails."""
    depends_on: Sequence[pulumi.Resource] = ()
    """What the claims and jobs need first: the namespace, the CSI driver."""


def _version_folder(model_id: str, version: str, cache_root: str) -> str:
    return f"{cache_root}{FILE_SYSTEM_PATH}/{model_id}/{version}"


def verify_command(
    model_id: str, version: str, jobs: int, cache_root: str = CACHE_MOUNT_PATH
) -> list[str]:
    """The argv, in the serving image, that loads and checks a version folder: every file's size
    and sha256 against manifest.json (``jobs`` files at once), the archive's members as stage 2
    unpacks them."""
    # Not the image's ENTRYPOINT (the entrypoint would serve), nor the ``llm-serving`` script
    # (operations.cli, whose operator commands the serving image does not need to import).
    return [
        "python3",
        "-m",
        "runtime.cli",
        "package",
        "verify",
        "--jobs",
        str(jobs),
        _version_folder(model_id, version, cache_root),
    ]


class ModelCache(pulumi.ComponentResource):
    """An encrypted PERSISTENT_2 Lustre file system, its claims and materialize jobs."""

    file_system_id: pulumi.Output[str]
    dns_name: pulumi.Output[str]
    mount_name: pulumi.Output[str]
    claim_name: str
    materialize_jobs: dict[tuple[str, str], k8s.batch.v1.Job]

    def __init__(
        self, name: str, args: ModelCacheArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        _validate(args)
        super().__init__("llm-serving:model_cache:ModelCache", name, None, opts)
        self._name = name
        self._args = args
        key = aws.kms.Key(
            f"{name}-key",
            description="FSx for Lustre model cache",
            enable_key_rotation=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        group, rules = self._create_security_group()
        file_system = aws.fsx.LustreFileSystem(
            f"{name}-fs",
            deployment_type="PERSISTENT_2",
            storage_type="SSD",
            storage_capacity=args.storage_capacity_gib,
            per_unit_storage_throughput=args.throughput_per_unit,
            file_system_type_version="2.15",
            data_compression_type="LZ4",
            kms_key_id=key.arn,
            subnet_ids=args.subnet_id,
            security_group_ids=[group.id],
            opts=pulumi.ResourceOptions(
                parent=self,
                # FSx refuses to create the file system (InvalidNetworkSettings) until its
                # security group admits Lustre traffic, and the group starts with no rules.
                depends_on=rules,
                # Replacing it empties the cache and moves the volume handle of the bound
                # static PVs; deleting it drops every restored model. Either must be deliberate.
                protect=True,
            ),
        )
        association = aws.fsx.DataRepositoryAssociation(
            f"{name}-models",
            file_system_id=file_system.id,
            file_system_path=FILE_SYSTEM_PATH,
            data_repository_path=pulumi.Output.concat("s3://", args.bucket_name, "/models/"),
            batch_import_meta_data_on_create=True,
            delete_data_in_filesystem=False,
            # Import only: the cache never writes back to the bucket.
            s3=aws.fsx.DataRepositoryAssociationS3Args(
                auto_import_policy=aws.fsx.DataRepositoryAssociationS3AutoImportPolicyArgs(
                    events=["NEW", "CHANGED", "DELETED"]
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.file_system_id = file_system.id
        self.dns_name = file_system.dns_name
        self.mount_name = file_system.mount_name
        self.claim_name = f"{name}-read-only"
        reader = self._create_claim(file_system, self.claim_name, read_only=True)
        # The Jobs' claim, mounted without Lustre's ro: their reads are what load the files.
        writer = self._create_claim(file_system, f"{name}-restore", read_only=False)
        self.materialize_jobs = {
            (model_id, version): self._create_job(model_id, version, writer, association)
            for model_id, version in args.versions
        }
        self.register_outputs(
            {
                "file_system_id": self.file_system_id,
                "dns_name": self.dns_name,
                "mount_name": self.mount_name,
                "claim_name": reader.metadata.name,
            }
        )

    def _create_security_group(
        self,
    ) -> tuple[aws.ec2.SecurityGroup, list[pulumi.Resource]]:
        """The file system's security group and its rules: Lustre ports from the nodes and
        between the servers."""
        group = aws.ec2.SecurityGroup(
            f"{self._name}-lustre",
            description="FSx for Lustre model cache: Lustre ports from GPU nodes only",
            vpc_id=self._args.vpc_id,
            opts=pulumi.ResourceOptions(parent=self),
        )
        sources = {"nodes": self._args.node_security_group_id, "servers": group.id}
        rules: list[pulumi.Resource] = []
        for low, high in LUSTRE_PORTS:
            for role, source in sources.items():
                # Lustre servers also talk to each other on the same ports.
                ingress = aws.vpc.SecurityGroupIngressRule(
                    f"{self._name}-lustre-{role}-{low}",
                    security_group_id=group.id,
                    referenced_security_group_id=source,
                    ip_protocol="tcp",
                    from_port=low,
                    to_port=high,
                    description=f"Lustre {low}-{high} from the {role}",
                    opts=pulumi.ResourceOptions(parent=group),
                )
                rules.append(ingress)
            egress = aws.vpc.SecurityGroupEgressRule(
                f"{self._name}-lustre-servers-out-{low}",
                security_group_id=group.id,
                referenced_security_group_id=group.id,
                ip_protocol="tcp",
                from_port=low,
                to_port=high,
                description=f"Lustre {low}-{high} between servers",
                opts=pulumi.ResourceOptions(parent=group),
            )
            rules.append(egress)
        return group, rules

    def _create_claim(
        self, file_system: aws.fsx.LustreFileSystem, claim: str, *, read_only: bool
    ) -> k8s.core.v1.PersistentVolumeClaim:
        namespace = self._args.namespace
        volume_name = f"{namespace}-{claim}"
        # The FSx CSI driver refuses ReadOnlyMany ("Volume capability not supported"), so both
        # claims are ReadWriteMany; readers get a Lustre mount with ``ro`` from the volume, on
        # top of the ``readOnly`` their pods set.
        mount_options = ["flock", "ro"] if read_only else ["flock"]
        volume = k8s.core.v1.PersistentVolume(
            f"{self._name}-{claim}-pv",
            metadata={"name": volume_name},
            spec={
                "capacity": {"storage": f"{self._args.storage_capacity_gib}Gi"},
                "accessModes": [ACCESS_MODE],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "mountOptions": mount_options,
                "csi": {
                    "driver": CSI_DRIVER,
                    "volumeHandle": file_system.id,
                    "volumeAttributes": {
                        "dnsname": file_system.dns_name,
                        "mountname": file_system.mount_name,
                    },
                },
            },
            opts=pulumi.ResourceOptions(parent=self),
        )
        return k8s.core.v1.PersistentVolumeClaim(
            f"{self._name}-{claim}",
            metadata={"name": claim, "namespace": namespace},
            spec={
                "accessModes": [ACCESS_MODE],
                "storageClassName": "",
                "volumeName": volume_name,
                "resources": {"requests": {"storage": f"{self._args.storage_capacity_gib}Gi"}},
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=[volume, *self._args.depends_on]),
        )

    def _create_job(
        self,
        model_id: str,
        version: str,
        claim: k8s.core.v1.PersistentVolumeClaim,
        association: aws.fsx.DataRepositoryAssociation,
    ) -> k8s.batch.v1.Job:
        job_name = dns_label("materialize", model_id, version)
        labels = {
            "app.kubernetes.io/name": "model-materialize",
            "app.kubernetes.io/part-of": "llm-serving",
            MODEL_ID_LABEL: dns_label(model_id),
            MODEL_VERSION_LABEL: dns_label(version),
        }
        return k8s.batch.v1.Job(
            f"{self._name}-{job_name}",
            metadata={"name": job_name, "namespace": self._args.namespace, "labels": labels},
            spec={
                "backoffLimit": 3,
                "activeDeadlineSeconds": self._args.restore_timeout_s,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "restartPolicy": "Never",
                        "affinity": self._on_client_nodes(),
                        "tolerations": gpu_tolerations(),
                        # A failed verification fails the pod, the Job, and the pulumi up
                        # that waits on it.
                        "containers": [
                            {
                                "name": "verify",
                                "image": self._args.serving_image,
                                "command": verify_command(
                                    model_id, version, self._args.verify_jobs
                                ),
                                "resources": VERIFY_RESOURCES,
                                # The servers' capabilities, not more: reading a file loads it
                                # from S3 without any Lustre tool or privilege.
                                "securityContext": {"allowPrivilegeEscalation": False},
                                "volumeMounts": [
                                    {
                                        "name": "model-cache",
                                        "mountPath": CACHE_MOUNT_PATH,
                                        # A check must not mend. readOnly binds the mount for
                                        # this container only: the Lustre client under it
                                        # still loads from S3 what the container reads.
                                        "readOnly": True,
                                    }
                                ],
                            }
                        ],
                        "volumes": [
                            {
                                "name": "model-cache",
                                "persistentVolumeClaim": {"claimName": claim.metadata.name},
                            }
                        ],
                    },
                },
            },
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[association, claim, *self._args.depends_on],
                # Pulumi waits for the Job to complete: as long as the Job itself may run.
                custom_timeouts=pulumi.CustomTimeouts(
                    create=f"{self._args.restore_timeout_s + 300}s",
                    update=f"{self._args.restore_timeout_s + 300}s",
                ),
            ),
        )

    def _on_client_nodes(self) -> dict[str, object]:
        """Node affinity for the nodes whose security group the Lustre servers admit."""
        selector = {
            "key": NODE_GROUP_LABEL,
            "operator": "In",
            "values": list(self._args.client_node_groups),
        }
        return {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [selector]}]
                }
            }
        }


def _validate(args: ModelCacheArgs) -> None:
    if args.throughput_per_unit not in THROUGHPUT_PER_UNIT:
        allowed = ", ".join(map(str, THROUGHPUT_PER_UNIT))
        raise ValueError(
            f"unsupported throughput_per_unit {args.throughput_per_unit}; "
            f"expected one of: {allowed}"
        )
    if args.storage_capacity_gib != 1200 and args.storage_capacity_gib % 2400:
        raise ValueError(
            f"storage_capacity_gib must be 1200 or a multiple of 2400, "
            f"got {args.storage_capacity_gib}"
        )
    if not args.client_node_groups:
        raise ValueError("client_node_groups must name at least one node group")
    if args.verify_jobs < 1:
        raise ValueError(f"verify_jobs must be at least 1, got {args.verify_jobs}")
    if len(set(args.versions)) != len(args.versions):
        raise ValueError(f"versions lists a (model_id, version) twice: {json.dumps(args.versions)}")
