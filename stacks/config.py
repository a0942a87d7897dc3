"""Typed configuration of the llm-serving stacks, read from ``stacks/Pulumi.<stack>.yaml``.

Every key lives under the ``llm-serving:`` namespace except ``aws:region``. A region stack
(``<env>-<region>``) is a :class:`RegionStackConfig`; the ``global`` stack is a
:class:`GlobalStackConfig`. Bad or missing keys raise :class:`StackConfigError`, whose message
names the key and the stack file.

Over 400 lines for a reason: it is the one schema of the stack files (every key, its checks and
the message naming it), kept in one module so that a key and its rules are found in one place.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import pulumi
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from components.cluster_addons import PROMETHEUS_MIN_STORAGE_GIB, PROMETHEUS_RETENTION
from components.eks_cluster import check_public_access_cidr, check_public_access_cidrs
from components.gateway import GRPC_SUBDOMAIN
from components.model_service.args import pod_requests
from components.system_node_group import AMI_TYPE as SYSTEM_AMI_TYPE
from contracts.compat import CompatError, load_matrix
from contracts.naming import dns_label, route_label
from stacks.instance_types import allocatable, instance_specs

__all__ = [
    "GLOBAL_STACK",
    "NAMESPACE",
    "STACKS_DIR",
    "AmiType",
    "CapacityType",
    "ClusterConfig",
    "CpuNodeGroupConfig",
    "GlobalStackConfig",
    "ImageConfig",
    "ModelCacheConfig",
    "ModelConfig",
    "ModelVersionConfig",
    "NetworkConfig",
    "NodeGroupConfig",
    "ObservabilityConfig",
    "RegionStackConfig",
    "ScalingConfig",
    "StackConfigError",
    "Strategy",
    "SystemNodesConfig",
    "load_stack_config",
    "read_stack_file",
    "region_entry",
    "stack_file",
    "vllm_version_for",
]

NAMESPACE = "llm-serving"
GLOBAL_STACK = "global"
STACKS_DIR = Path(__file__).resolve().parent

Strategy = Literal["red-black", "versioned"]
AmiType = Literal["AL2023_x86_64_NVIDIA", "BOTTLEROCKET_x86_64_NVIDIA"]
CpuAmiType = Literal["AL2023_x86_64_STANDARD", "BOTTLEROCKET_x86_64"]
CapacityType = Literal["ON_DEMAND", "SPOT", "CAPACITY_BLOCK"]
ScalingMetric = Literal["queue_size", "queue_time_us", "inference_rate"]
_NAME = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
Name = Annotated[str, Field(pattern=_NAME)]
_T = TypeVar("_T")


class StackConfigError(pulumi.RunError):
    """A stack file holds a missing or invalid key; ``key`` and ``path`` say which and where.

    A ``RunError``: the Pulumi CLI prints its message alone, any other exception with the
    program's traceback. Not a ``ValueError``: the SDK rewraps those raised in an input's apply.
    """

    def __init__(self, key: str, path: Path | str, problem: str) -> None:
        self.key = key
        self.path = Path(path)
        super().__init__(f"{self.path}: {key}: {problem}")


class _FieldError(ValueError):
    """A check across fields that is about one of them: ``at`` is its path in the model."""

    def __init__(self, at: tuple[str | int, ...], problem: str) -> None:
        self.at = at
        super().__init__(problem)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelVersionConfig(_Strict):
    """One published model version (``models/<id>/<version>/`` in the model bucket)."""

    version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    route_weight: int | None = Field(default=None, ge=0, le=100)
    replicas: int | None = Field(default=None, ge=0, description="overrides the model's replicas")
    created_at: date | None = Field(
        default=None, description="first deployed (Versioned: the advisory age policy reads it)"
    )


class ScalingConfig(_Strict):
    """What KEDA scales a model on (with ``max_replicas``) and the value it aims for."""

    metric: ScalingMetric = Field(
        description="queue_size: vLLM's waiting requests (LLMs); queue_time_us: Triton's average "
        "queue time per request; inference_rate: Triton's inferences per second"
    )
    target: int = Field(
        ge=1,
        description="waiting requests per pod, microseconds of queue time per request, or "
        "inferences per second per pod",
    )


# LLMs (vLLM) scale on their waiting requests unless the stack says otherwise.
_DEFAULT_SCALING = ScalingConfig(metric="queue_size", target=8)


class ModelConfig(_Strict):
    """A model served in the region: Red-Black serves its last version, Versioned all of them.

    ``gpus: 0`` makes it a CPU model (Triton's CPU backends, no vLLM) on a CPU node group.
    """

    id: Name = Field(description="names its Kubernetes Services: starts with a letter")
    strategy: Strategy = "red-black"
    versions: list[ModelVersionConfig] = Field(min_length=1)
    node_group: Name = Field(
        description="a node group of node_groups (GPU) or, with gpus: 0, of cpu_node_groups"
    )
    gpus: int = Field(default=1, ge=0, le=8, description="GPUs per serving pod; 0: a CPU model")
    replicas: int = Field(default=1, ge=0)
    max_replicas: int | None = Field(default=None, ge=1, description="enables KEDA scaling")
    scaling: ScalingConfig | None = Field(
        default=None,
        description="what KEDA scales on; unset: queue_size 8 (required for a CPU model)",
    )
    memory_gib: int = Field(default=64, ge=4)
    cpu: int = Field(default=8, ge=1)
    shm_gib: int = Field(default=16, ge=1)
    api_keys_secret: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$",
        description="Secret in the namespace whose key sha256-digests lists the SHA-256 hex "
        "digests of the OpenAI frontend's API keys; unset: the frontend takes no keys",
    )

    @model_validator(mode="before")
    @classmethod
    def _queue_target_moved(cls, data: Any) -> Any:
        # Stack files written before `scaling` existed name the old key; say what replaces it.
        if isinstance(data, Mapping) and "queue_target" in data:
            raise _FieldError(
                ("queue_target",),
                "queue_target became scaling: write scaling: {metric: queue_size, target: "
                f"{data['queue_target']}}} instead",
            )
        return data

    @field_validator("id")
    @classmethod
    def _id_starts_with_a_letter(cls, value: str) -> str:
        if not value[0].isalpha():
            raise ValueError(
                f"{value!r} must start with a letter: a model id begins the names of its "
                "Kubernetes Services, which must be DNS-1035 labels"
            )
        if value == GRPC_SUBDOMAIN:
            raise ValueError(
                f"{value!r} is the subdomain of the gRPC hostnames (<model>.{GRPC_SUBDOMAIN}."
                "<domain>): the model's OpenAI hostnames would be other models' gRPC ones; "
                "rename the model"
            )
        return value

    @model_validator(mode="after")
    def _unique_versions(self) -> ModelConfig:
        names = [v.version for v in self.versions]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise _FieldError(("versions",), f"versions listed twice: {', '.join(duplicates)}")
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise ValueError("max_replicas must be at least replicas")
        last = self.versions[-1]
        served = last.replicas if last.replicas is not None else self.replicas
        if self.strategy == "red-black" and served < 1:
            raise ValueError("replicas must be at least 1 for a red-black model (a Rollout)")
        self._check_served_replicas()
        if self.strategy == "versioned":
            self._check_version_names()
        self._check_route_weights()
        self._check_scaling()
        return self

    def _check_scaling(self) -> None:
        if self.scaling is not None and self.max_replicas is None:
            raise _FieldError(
                ("scaling",),
                "scaling applies only with max_replicas (KEDA scales between replicas and "
                "max_replicas); set max_replicas or remove scaling",
            )
        if self.gpus:
            return
        # A CPU model runs on Triton's CPU backends: no vLLM, so no vLLM series to read.
        if self.strategy == "red-black":
            raise _FieldError(
                ("strategy",),
                "a CPU model (gpus: 0) cannot be red-black: the rollout analysis reads vLLM's "
                "time to first token, which Triton's CPU backends do not export; "
                "use strategy: versioned",
            )
        if self.max_replicas is not None and self.scaling is None:
            raise _FieldError(
                ("scaling",),
                "a CPU model (gpus: 0) with max_replicas needs scaling: the default, queue_size, "
                "reads vLLM's waiting requests; set scaling: {metric: queue_time_us, target: "
                "<microseconds per request>} or {metric: inference_rate, target: <inferences/s "
                "per pod>}",
            )
        if self.scaling is not None and self.scaling.metric == "queue_size":
            raise _FieldError(
                ("scaling", "metric"),
                "queue_size reads vLLM's waiting requests, which a CPU model (gpus: 0) does not "
                "export; use queue_time_us or inference_rate",
            )

    @property
    def trigger(self) -> ScalingConfig:
        """What KEDA scales on: :attr:`scaling`, else vLLM's waiting requests."""
        return _DEFAULT_SCALING if self.scaling is None else self.scaling

    def _served(self) -> list[tuple[int, ModelVersionConfig]]:
        pairs = list(enumerate(self.versions))
        return pairs[-1:] if self.strategy == "red-black" else pairs

    def _check_served_replicas(self) -> None:
        if self.max_replicas is None:
            return
        for index, version in self._served():
            if version.replicas is not None and version.replicas > self.max_replicas:
                raise _FieldError(
                    ("versions", index, "replicas"),
                    f"{version.replicas} is above the model's max_replicas "
                    f"({self.max_replicas}); KEDA scales between the two, so lower replicas "
                    "or raise max_replicas",
                )

    def _check_version_names(self) -> None:
        """Each version of a Versioned model gets its own Service, Deployment and routes."""
        seen: dict[tuple[str, str], str] = {}
        for version in self.versions:
            names = (
                ("Service name", dns_label(self.id, version.version)),
                ("route and hostname label", route_label(version.version)),
            )
            for kind, name in names:
                other = seen.setdefault((kind, name), version.version)
                if other != version.version:
                    raise _FieldError(
                        ("versions",),
                        f"versions {other!r} and {version.version!r} both become the "
                        f"{kind} {name!r} (lower case, '.' and '_' as '-'); "
                        "a versioned model's versions must differ in more than that",
                    )

    def _check_route_weights(self) -> None:
        weighted = [(i, v) for i, v in enumerate(self.versions) if v.route_weight is not None]
        if not weighted:
            return
        if self.strategy != "versioned":
            raise _FieldError(
                ("versions", weighted[0][0], "route_weight"),
                "route_weight applies to versioned models only; a red-black model shifts "
                "traffic through its rollout steps, so remove it (or use strategy: versioned)",
            )
        total = sum(v.route_weight or 0 for _, v in weighted)
        if total != 100:
            raise _FieldError(
                ("versions",),
                f"route_weight values sum to {total}; they must sum to 100 "
                "(or leave route_weight unset everywhere)",
            )
        for index, version in enumerate(self.versions):
            if route_label(version.version) == "shared":
                raise _FieldError(
                    ("versions", index, "version"),
                    f"{version.version!r} is named like the model's shared weighted routes "
                    "(<model>-shared); a versioned model with route_weight cannot serve it",
                )

    def object_names(self) -> dict[tuple[str, str], tuple[str | int, ...]]:
        """``(kind, name)`` of the objects whose names its id and versions make, each with the
        key that makes it: the workload and its Service (``<id>`` Red-Black, ``<id>-<version>``
        Versioned, as ``stacks.model_strategies`` names them) and the materialize Jobs."""
        names: dict[tuple[str, str], tuple[str | int, ...]] = {}
        for index, version in self._served():
            key: tuple[str | int, ...] = ("versions", index, "version")
            if self.strategy == "red-black":
                names["workload", dns_label(self.id)] = ("id",)
            else:
                names["workload", dns_label(self.id, version.version)] = key
            names["materialize Job", dns_label("materialize", self.id, version.version)] = key
        return names

    @property
    def served_versions(self) -> list[ModelVersionConfig]:
        """The versions that get servers: the last one (Red-Black) or every one (Versioned)."""
        return self.versions[-1:] if self.strategy == "red-black" else list(self.versions)


def _check_instance_types(types: list[str], gpus: int | None) -> None:
    """Every type is in ``stacks/instance_types.yaml``; with ``gpus``, each has that many GPUs
    (0 for a CPU model group)."""
    specs = instance_specs()
    for index, name in enumerate(types):
        spec = specs.get(name)
        if spec is None:
            families = sorted({n.split(".")[0] for n in specs})
            raise _FieldError(
                ("instance_types", index),
                f"{name!r} is not in stacks/instance_types.yaml (families: "
                f"{', '.join(families)}); add its specification there or pick a listed type",
            )
        if gpus == 0 and spec.gpus:
            raise _FieldError(
                ("instance_types", index),
                f"{name} has {spec.gpus} GPUs; a CPU node group's types have none (list GPU "
                "types under node_groups, CPU ones such as c7i or m7i here)",
            )
        if gpus is not None and spec.gpus != gpus:
            raise _FieldError(
                ("instance_types", index),
                f"{name} has {spec.gpus} GPUs but gpus_per_node is {gpus}; a node group's "
                "types must all have gpus_per_node GPUs",
            )


# EKS AMI release versions (docs/stacks.md#pinning-the-ami-release): Amazon Linux names the
# Kubernetes version it runs and the build date, Bottlerocket its OS version and commit.
_AL2023_RELEASE = re.compile(r"^(\d+\.\d+)\.\d+-\d{8}$")
_BOTTLEROCKET_RELEASE = re.compile(r"^\d+\.\d+\.\d+-([0-9a-f]{8})$")
_RELEASE_DESCRIPTION = (
    "EKS AMI release of the group's ami_type, rolled in place when changed; unset: the newest "
    "release when the group is created or its Kubernetes version changes"
)


def _release_parameter(ami_type: str, kubernetes: str) -> str:
    """The public SSM parameter that names the newest release of ``ami_type`` for Kubernetes
    ``kubernetes``."""
    nvidia = ami_type.endswith("NVIDIA")
    if ami_type.startswith("AL2023"):
        flavour = "nvidia" if nvidia else "standard"
        return (
            f"/aws/service/eks/optimized-ami/{kubernetes}/amazon-linux-2023/x86_64/{flavour}/"
            "recommended/release_version"
        )
    flavour = "-nvidia" if nvidia else ""
    return f"/aws/service/bottlerocket/aws-k8s-{kubernetes}{flavour}/x86_64/latest/image_version"


def _check_release_format(ami_type: str, release: str | None) -> None:
    """``release`` (if set) has the form of ``ami_type``'s family."""
    if release is None:
        return
    where = f"aws ssm get-parameter --name {_release_parameter(ami_type, '<cluster.version>')}"
    if ami_type.startswith("AL2023"):
        if not _AL2023_RELEASE.match(release):
            raise _FieldError(
                ("release_version",),
                f"{release!r} is not an Amazon Linux 2023 release: expected <Kubernetes "
                f"major.minor.patch>-<YYYYMMDD>, such as 1.33.0-20250704 ({where})",
            )
        return
    match = _BOTTLEROCKET_RELEASE.match(release)
    if match is None or _is_date(match.group(1)):
        # An Amazon Linux release has the same shape, and its date is valid hex.
        raise _FieldError(
            ("release_version",),
            f"{release!r} is not a Bottlerocket release: expected <OS version>-<8-hex-digit "
            f"commit>, such as 1.34.0-18d04e52 ({where})",
        )


def _is_date(digits: str) -> bool:
    """``digits`` (eight hex digits) read as a date of this century, YYYYMMDD."""
    if not digits.startswith("20") or not digits.isdigit():
        return False
    try:
        date(int(digits[:4]), int(digits[4:6]), int(digits[6:]))
    except ValueError:
        return False
    return True


class NodeGroupConfig(_Strict):
    """An EKS managed GPU node group."""

    name: Name
    ami_type: AmiType = "AL2023_x86_64_NVIDIA"
    instance_types: list[str] = Field(min_length=1)
    capacity_type: CapacityType = "ON_DEMAND"
    min_size: int = Field(ge=0)
    max_size: int = Field(ge=1)
    desired_size: int = Field(ge=0)
    gpus_per_node: int = Field(ge=1, le=16)
    root_volume_gib: int = Field(default=200, ge=20)
    capacity_reservation_id: str | None = Field(default=None, pattern=r"^cr-[0-9a-f]+$")
    subnet_id: str | None = Field(
        default=None,
        pattern=r"^subnet-[0-9a-f]+$",
        description="CAPACITY_BLOCK only: the subnet in the reservation's Availability Zone, "
        "one of network.private_subnet_ids (a Capacity Block lives in one zone)",
    )
    release_version: str | None = Field(default=None, description=_RELEASE_DESCRIPTION)

    @model_validator(mode="after")
    def _bounds(self) -> NodeGroupConfig:
        if not self.min_size <= self.desired_size <= self.max_size:
            raise ValueError("expected min_size <= desired_size <= max_size")
        if (self.capacity_type == "CAPACITY_BLOCK") != (self.capacity_reservation_id is not None):
            raise ValueError(
                "capacity_reservation_id is required with capacity_type CAPACITY_BLOCK, "
                "and only there"
            )
        if (self.capacity_type == "CAPACITY_BLOCK") != (self.subnet_id is not None):
            raise ValueError(
                "subnet_id (the subnet in the Capacity Block's Availability Zone) is required "
                "with capacity_type CAPACITY_BLOCK, and only there"
            )
        _check_instance_types(self.instance_types, self.gpus_per_node)
        _check_release_format(self.ami_type, self.release_version)
        return self


class CpuNodeGroupConfig(_Strict):
    """An EKS managed node group of CPU instances for CPU models (``gpus: 0``), tainted so that
    only their pods land there."""

    name: Name
    ami_type: CpuAmiType = "AL2023_x86_64_STANDARD"
    instance_types: list[str] = Field(min_length=1)
    capacity_type: Literal["ON_DEMAND", "SPOT"] = "ON_DEMAND"
    min_size: int = Field(ge=0)
    max_size: int = Field(ge=1)
    desired_size: int = Field(ge=0)
    root_volume_gib: int = Field(
        default=100, ge=20, description="also holds the unpacked packages (no instance store)"
    )
    release_version: str | None = Field(default=None, description=_RELEASE_DESCRIPTION)

    @model_validator(mode="after")
    def _bounds(self) -> CpuNodeGroupConfig:
        if not self.min_size <= self.desired_size <= self.max_size:
            raise ValueError("expected min_size <= desired_size <= max_size")
        _check_instance_types(self.instance_types, 0)
        _check_release_format(self.ami_type, self.release_version)
        return self


class SystemNodesConfig(_Strict):
    """The untainted CPU node group of a created cluster: add-ons, controllers, CoreDNS, Jobs."""

    instance_types: list[str] = Field(default_factory=lambda: ["m6i.xlarge"], min_length=1)
    min_size: int = Field(default=2, ge=1)
    desired_size: int = Field(default=2, ge=1)
    max_size: int = Field(default=4, ge=1)
    release_version: str | None = Field(
        default=None, description=f"{_RELEASE_DESCRIPTION} (ami_type {SYSTEM_AMI_TYPE})"
    )

    @model_validator(mode="after")
    def _bounds(self) -> SystemNodesConfig:
        if not self.min_size <= self.desired_size <= self.max_size:
            raise ValueError("expected min_size <= desired_size <= max_size")
        _check_instance_types(self.instance_types, None)
        _check_release_format(SYSTEM_AMI_TYPE, self.release_version)
        return self


class ClusterConfig(_Strict):
    """The EKS cluster: created by the stack, or an existing one adopted by name."""

    mode: Literal["create", "adopt"]
    name: Name
    version: str = Field(default="1.33", pattern=r"^1\.\d{2}$")
    system_nodes: SystemNodesConfig = Field(
        default_factory=SystemNodesConfig,
        description="created clusters only: an adopted cluster brings its own system nodes",
    )
    public_access_cidrs: list[Annotated[str, AfterValidator(check_public_access_cidr)]] | None = (
        Field(
            default=None,
            description="created clusters only, required: the public IPv4 ranges admitted to "
            "the API's public endpoint; [] for none (private endpoint only)",
        )
    )

    @model_validator(mode="after")
    def _only_when_created(self) -> ClusterConfig:
        if self.mode == "adopt":
            for key in ("system_nodes", "public_access_cidrs"):
                if key in self.model_fields_set:
                    raise ValueError(f"{key} applies only to a created cluster (mode: create)")
            return self
        if self.public_access_cidrs is None:
            # No default: 0.0.0.0/0 would open the API to the internet unasked, anything
            # narrower would lock out whoever deploys from elsewhere.
            raise _FieldError(
                ("public_access_cidrs",),
                "missing required key for a created cluster: list who may reach the API's "
                "public endpoint, the public egress ranges (a.b.c.d/prefix) of your operators "
                "and of the runners that deploy; [] for no public endpoint (deploy from inside "
                "the VPC); [0.0.0.0/0] for the whole internet, what EKS admits by default",
            )
        try:
            check_public_access_cidrs(self.public_access_cidrs)
        except ValueError as exc:
            raise _FieldError(("public_access_cidrs",), str(exc)) from None
        return self


class NetworkConfig(_Strict):
    """The VPC the cluster, node groups and file system live in."""

    vpc_id: str = Field(pattern=r"^vpc-[0-9a-f]+$")
    private_subnet_ids: list[Annotated[str, Field(pattern=r"^subnet-[0-9a-f]+$")]] = Field(
        min_length=1
    )
    node_security_group_id: str | None = Field(
        default=None,
        pattern=r"^sg-[0-9a-f]+$",
        description="adopted clusters: the security group of the GPU nodes",
    )


class ModelCacheConfig(_Strict):
    """The FSx for Lustre model cache."""

    storage_capacity_gib: int = Field(default=2400, ge=1200)
    throughput_per_unit: Literal[125, 250, 500, 1000] = 250
    verify_jobs: int = Field(
        default=16,
        ge=1,
        description="files each materialize Job reads and hashes at once (FSx loads them from S3 "
        "in parallel)",
    )
    subnet_id: str | None = Field(
        default=None,
        pattern=r"^subnet-[0-9a-f]+$",
        description="the file system's subnet, one of network.private_subnet_ids; unset: the "
        "first listed, so reordering that list would move (replace) the file system",
    )

    @model_validator(mode="before")
    @classmethod
    def _restore_batch_size_removed(cls, data: Any) -> Any:
        # Stack files written for the lfs hsm_restore step name its key; say what replaced it.
        if isinstance(data, Mapping) and "restore_batch_size" in data:
            raise _FieldError(
                ("restore_batch_size",),
                "restore_batch_size was removed (materialize Jobs load files by reading them, "
                "with no lfs hsm_restore): delete it; verify_jobs sets how many files a Job "
                "reads at once",
            )
        return data

    @model_validator(mode="after")
    def _capacity(self) -> ModelCacheConfig:
        if self.storage_capacity_gib != 1200 and self.storage_capacity_gib % 2400:
            raise ValueError("storage_capacity_gib must be 1200 or a multiple of 2400")
        return self


class ObservabilityConfig(_Strict):
    """The region's Prometheus (kube-prometheus-stack), which versions gc and KEDA read."""

    prometheus_storage_gib: int = Field(
        default=50,
        ge=PROMETHEUS_MIN_STORAGE_GIB,
        description=f"Prometheus's gp3 volume; it keeps {PROMETHEUS_RETENTION} of samples within "
        "80% of it (default: about 20 GiB for a few hundred thousand series at a 30 s scrape "
        "interval, doubled for headroom). Grow the claim before raising it "
        "(docs/stacks.md#prometheus-storage)",
    )


class ImageConfig(_Strict):
    """The serving image, pulled from the region's replica of the global ECR repository."""

    tag: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
    triton_release: str = Field(default="26.08", pattern=r"^\d{2}\.\d{2}$")

    @model_validator(mode="after")
    def _tag_names_the_release(self) -> ImageConfig:
        # Images are tagged <version>-triton<release>; the policy pack reads the pair from it.
        if not self.tag.endswith(f"-triton{self.triton_release}"):
            raise ValueError(
                f"tag {self.tag!r} must end with -triton{self.triton_release} "
                f"(the image's Triton release, triton_release)"
            )
        return self


class RegionStackConfig(_Strict):
    """Everything a region stack (``<env>-<region>``) reads."""

    region: str = Field(pattern=r"^[a-z]{2}-[a-z]+-\d$")
    environment: Literal["dev", "staging", "prod"]
    global_stack: str = Field(description="StackReference name of the global stack")
    cluster: ClusterConfig
    network: NetworkConfig
    node_groups: list[NodeGroupConfig] = Field(min_length=1)
    cpu_node_groups: list[CpuNodeGroupConfig] = Field(default_factory=list)
    model_cache: ModelCacheConfig = ModelCacheConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    image: ImageConfig
    namespace: Name = "llm-serving"
    domain: str = Field(
        pattern=r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$",
        description="models answer on <model>.<domain> (and <version>.<model>.<domain>)",
    )
    models: list[ModelConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self) -> RegionStackConfig:
        groups = {g.name: g for g in self.node_groups}
        if len(groups) != len(self.node_groups):
            raise ValueError("node_groups: names must be unique")
        cpu_groups = {g.name: g for g in self.cpu_node_groups}
        if len(cpu_groups) != len(self.cpu_node_groups):
            raise ValueError("cpu_node_groups: names must be unique")
        both = sorted(groups.keys() & cpu_groups.keys())
        if both:
            raise ValueError(
                f"cpu_node_groups: {', '.join(both)} also named in node_groups; node groups of "
                "both kinds share one namespace of names, so rename one"
            )
        ids = [m.id for m in self.models]
        if len(set(ids)) != len(ids):
            raise ValueError("models: ids must be unique")
        self._check_object_names()
        for i, model in enumerate(self.models):
            self._check_placement(i, model, groups, cpu_groups)
        for at, group in enumerate(self.node_groups):
            if (
                group.subnet_id is not None
                and group.subnet_id not in self.network.private_subnet_ids
            ):
                raise _FieldError(
                    ("node_groups", at, "subnet_id"),
                    f"{group.subnet_id} is not one of network.private_subnet_ids "
                    f"({', '.join(self.network.private_subnet_ids)}); name the private subnet "
                    f"in the Availability Zone of {group.capacity_reservation_id}",
                )
        cache_subnet = self.model_cache.subnet_id
        if cache_subnet is not None and cache_subnet not in self.network.private_subnet_ids:
            raise _FieldError(
                ("model_cache", "subnet_id"),
                f"{cache_subnet} is not one of network.private_subnet_ids "
                f"({', '.join(self.network.private_subnet_ids)}); name the private subnet the "
                "file system lives in",
            )
        if self.cluster.mode == "adopt" and self.network.node_security_group_id is None:
            raise ValueError("network.node_security_group_id is required to adopt a cluster")
        self._check_release_versions()
        return self

    def _check_release_versions(self) -> None:
        """Each Amazon Linux release pinned runs the cluster's Kubernetes version: EKS refuses a
        release of another one. Bottlerocket releases do not name a Kubernetes version."""
        pinned: list[tuple[tuple[str | int, ...], str, str | None]] = [
            *(
                (("node_groups", i), g.ami_type, g.release_version)
                for i, g in enumerate(self.node_groups)
            ),
            *(
                (("cpu_node_groups", i), g.ami_type, g.release_version)
                for i, g in enumerate(self.cpu_node_groups)
            ),
            (
                ("cluster", "system_nodes"),
                SYSTEM_AMI_TYPE,
                self.cluster.system_nodes.release_version,
            ),
        ]
        cluster = self.cluster.version
        for at, ami_type, release in pinned:
            match = _AL2023_RELEASE.match(release or "")
            if match is None or not ami_type.startswith("AL2023"):
                continue
            if self.cluster.mode == "adopt" and "version" not in self.cluster.model_fields_set:
                raise _FieldError(
                    (*at, "release_version"),
                    f"{release} runs Kubernetes {match.group(1)}, and an adopted cluster's "
                    "version is read only at pulumi up: set cluster.version to the cluster's "
                    "Kubernetes version (major.minor) so that the release can be checked",
                )
            if match.group(1) != cluster:
                raise _FieldError(
                    (*at, "release_version"),
                    f"{release} runs Kubernetes {match.group(1)}, but cluster.version is "
                    f"{cluster} and EKS refuses a release of another Kubernetes version; pin a "
                    f"{cluster} release (aws ssm get-parameter --name "
                    f"{_release_parameter(ami_type, cluster)}), changing it together with "
                    "cluster.version",
                )

    @property
    def cache_subnet_id(self) -> str:
        """The model cache's subnet: ``model_cache.subnet_id``, else the first private subnet."""
        if self.model_cache.subnet_id is not None:
            return self.model_cache.subnet_id
        return self.network.private_subnet_ids[0]

    def _check_placement(
        self,
        i: int,
        model: ModelConfig,
        groups: Mapping[str, NodeGroupConfig],
        cpu_groups: Mapping[str, CpuNodeGroupConfig],
    ) -> None:
        """The model names a group of its kind (GPU with gpus >= 1, CPU with gpus: 0) and fits."""
        group = groups.get(model.node_group)
        if group is not None:
            if not model.gpus:
                raise _FieldError(
                    ("models", i, "gpus"),
                    f"0 GPUs, but node group {group.name!r} is a GPU group (node_groups); "
                    "name a group of cpu_node_groups for a CPU model, or request GPUs",
                )
            if model.gpus > group.gpus_per_node:
                raise ValueError(
                    f"models[{i}].gpus: {model.gpus} GPUs do not fit on a "
                    f"{group.gpus_per_node}-GPU node of {group.name!r}"
                )
            at = ("node_groups", self.node_groups.index(group))
            self._check_fit(i, model, at, group.name, group.instance_types)
            return
        cpu_group = cpu_groups.get(model.node_group)
        if cpu_group is None:
            raise ValueError(
                f"models[{i}].node_group: unknown node group {model.node_group!r}; "
                f"expected one of: {', '.join([*groups, *cpu_groups])}"
            )
        if model.gpus:
            raise _FieldError(
                ("models", i, "gpus"),
                f"{model.gpus} GPUs, but node group {cpu_group.name!r} is a CPU group "
                "(cpu_node_groups); set gpus: 0, or name a GPU group of node_groups",
            )
        at = ("cpu_node_groups", self.cpu_node_groups.index(cpu_group))
        self._check_fit(i, model, at, cpu_group.name, cpu_group.instance_types)

    @staticmethod
    def _check_fit(
        index: int, model: ModelConfig, at: tuple[str, int], group: str, types: list[str]
    ) -> None:
        """The model's pod fits every instance type of its node group after the node's
        reserved capacity (``stacks/instance_types.py``): a type it does not fit would come up
        as a node the pod can never be scheduled on."""
        wanted = pod_requests(model.cpu, model.memory_gib, model.gpus)
        for t, name in enumerate(types):
            free = allocatable(instance_specs()[name])
            short = [
                f"{what} {need} > {has}"
                for what, need, has in (
                    ("CPU", wanted.cpu_milli / 1000, free.cpu_milli / 1000),
                    (
                        "memory GiB",
                        round(wanted.memory_mib / 1024, 2),
                        round(free.memory_mib / 1024, 2),
                    ),
                    ("GPUs", wanted.gpus, free.gpus),
                )
                if need > has
            ]
            if short:
                raise _FieldError(
                    (*at, "instance_types", t),
                    f"model {model.id!r} (models[{index}]) does not fit instance type {name} of "
                    f"node group {group!r}: its pod requests {', '.join(short)} "
                    "(allocatable after the node's reserved capacity); drop "
                    f"{name} from the node group or lower the model's cpu/memory_gib/gpus",
                )

    def _check_object_names(self) -> None:
        """Two models must not name the same object: Pulumi refuses the repeated resource."""
        owners: dict[tuple[str, str], str] = {}
        for i, model in enumerate(self.models):
            for (kind, name), at in model.object_names().items():
                whose = f"model {model.id!r}"
                if at[0] == "versions":
                    whose = f"version {model.versions[int(at[1])].version!r} of {whose}"
                other = owners.setdefault((kind, name), whose)
                if other != whose:
                    raise _FieldError(
                        ("models", i, *at),
                        f"{whose} and {other} both name the {kind} {name!r} "
                        "(<id> for a red-black model, <id>-<version> for a versioned one); "
                        "rename one",
                    )


class GlobalStackConfig(_Strict):
    """The ``global`` stack: shared image repository and per-region model buckets."""

    region: str = Field(pattern=r"^[a-z]{2}-[a-z]+-\d$", description="the publishing region")
    replica_regions: list[str] = Field(min_length=1)
    image_repository: str = Field(default="llm-serving/triton-vllm", pattern=r"^[a-z0-9/._-]+$")

    @model_validator(mode="after")
    def _distinct(self) -> GlobalStackConfig:
        if self.region in self.replica_regions:
            raise ValueError("replica_regions must not list the publishing region")
        twice = sorted({r for r in self.replica_regions if self.replica_regions.count(r) > 1})
        if twice:
            raise ValueError(f"replica_regions lists {', '.join(twice)} more than once")
        return self


# Which config key (as written in the stack file) holds each field.
_REGION_KEYS = {
    "region": "aws:region",
    **{
        name: f"{NAMESPACE}:{name}"
        for name in RegionStackConfig.model_fields
        if name not in {"region"}
    },
}
_GLOBAL_KEYS = {
    "region": "aws:region",
    **{name: f"{NAMESPACE}:{name}" for name in GlobalStackConfig.model_fields if name != "region"},
}


def stack_file(stack: str, stacks_dir: Path = STACKS_DIR) -> Path:
    """The file that holds a stack's configuration."""
    return stacks_dir / f"Pulumi.{stack}.yaml"


def read_stack_file(path: Path) -> dict[str, Any]:
    """The ``config:`` mapping of a stack file, keys as written (``llm-serving:models``)."""
    if not path.is_file():
        raise StackConfigError("config", path, "stack file not found")
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise StackConfigError("config", path, f"not valid YAML: {exc}") from exc
    config = document.get("config") if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise StackConfigError("config", path, "expected a 'config:' mapping")
    return config


def load_stack_config(
    stack: str,
    get: Callable[[str], Any] | None = None,
    stacks_dir: Path = STACKS_DIR,
    configured: Collection[str] | None = None,
) -> RegionStackConfig | GlobalStackConfig:
    """Validate a stack's configuration; ``get(key)`` reads a key (default: the stack file).

    In a Pulumi run ``get`` reads ``pulumi.Config`` (values arrive as JSON strings) and
    ``configured`` names every key the engine passed, so that a mistyped key fails instead of
    reading as unset; the offline plan and tests read the file directly.
    """
    path = stack_file(stack, stacks_dir)
    model: type[RegionStackConfig] | type[GlobalStackConfig]
    keys: Mapping[str, str]
    if stack == GLOBAL_STACK:
        model, keys = GlobalStackConfig, _GLOBAL_KEYS
    else:
        model, keys = RegionStackConfig, _REGION_KEYS
    if get is None:
        values = read_stack_file(path)
        configured = values.keys()
        get = values.get
    _check_keys(configured or (), keys, path)
    raw: dict[str, Any] = {}
    for field, key in keys.items():
        value = get(key)
        if isinstance(value, str) and value[:1] in ("[", "{"):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise StackConfigError(key, path, f"not valid JSON: {exc}") from exc
        if value is not None:
            raw[field] = value
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise _config_error(exc, keys, path) from None


def _check_keys(configured: Collection[str], keys: Mapping[str, str], path: Path) -> None:
    """Refuse a key of this project that no field reads: unset, it would drop what it holds."""
    for key in sorted(configured):
        if ":" not in key:
            # Pulumi files a bare key under the project; the offline plan would not see it.
            raise StackConfigError(key, path, f"keys need a namespace; write {NAMESPACE}:{key}")
        if key.startswith(f"{NAMESPACE}:") and key not in keys.values():
            allowed = ", ".join(sorted(keys.values()))
            raise StackConfigError(key, path, f"unknown key; expected one of: {allowed}")


def _config_error(exc: ValidationError, keys: Mapping[str, str], path: Path) -> StackConfigError:
    """The first validation error, phrased with the stack-file key it concerns."""
    error = exc.errors()[0]
    location = [str(p) for p in error["loc"]]
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, _FieldError):
        location += [str(p) for p in cause.at]
    problem = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "missing":
        problem = "missing required key"
    elif error["type"] == "extra_forbidden":
        problem = "unknown key"
    if not location:
        # A check across fields: its message starts with the field it is about.
        match = re.match(r"([a-z_]+)", problem)
        field = match.group(1) if match else ""
        return StackConfigError(keys.get(field, f"{NAMESPACE}:*"), path, problem)
    suffix = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in location[1:])
    return StackConfigError(f"{keys[location[0]]}{suffix}", path, problem)


def region_entry(
    outputs: Mapping[str, _T], config: RegionStackConfig, stack: str, stacks_dir: Path = STACKS_DIR
) -> _T:
    """This region's value of a global stack output keyed by region (``model_buckets``).

    Raises :class:`StackConfigError` naming ``aws:region`` when the global stack has no replica
    in this region.
    """
    if config.region not in outputs:
        regions = ", ".join(sorted(outputs)) or "none"
        raise StackConfigError(
            "aws:region",
            stack_file(stack, stacks_dir),
            f"the global stack {config.global_stack!r} has no replica in {config.region} "
            f"(it has: {regions}); add {config.region} to llm-serving:replica_regions in "
            f"{stack_file(GLOBAL_STACK, stacks_dir)} and update the global stack first",
        )
    return outputs[config.region]


def vllm_version_for(config: RegionStackConfig, stack: str, stacks_dir: Path = STACKS_DIR) -> str:
    """The vLLM version that the stack's Triton release ships (``images/compat.toml``).

    Raises :class:`StackConfigError` naming ``llm-serving:image`` and the supported releases.
    """
    try:
        return load_matrix().for_triton(config.image.triton_release).vllm
    except CompatError as exc:
        raise StackConfigError(
            f"{NAMESPACE}:image.triton_release", stack_file(stack, stacks_dir), str(exc)
        ) from None
