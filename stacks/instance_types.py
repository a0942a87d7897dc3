"""The instance specifications the stacks support (``stacks/instance_types.yaml``) and what a
node of each type leaves to pods after its reserved capacity.

Reserved capacity follows the EKS-optimized AMIs' bootstrap (AL2023 ``nodeadm``, Bottlerocket):

- kube-reserved memory: ``255 MiB + 11 MiB x max_pods``;
- kube-reserved CPU: 6 % of the first core, 1 % of the second, 0.5 % of the third and fourth,
  0.25 % of every further core;
- eviction threshold: ``memory.available < 100Mi``;
- ``max_pods``: 110 below 30 vCPUs, else 250 (EKS's ``max-pods-calculator`` cap). Without
  prefix delegation the AMI takes the ENI-based count instead, which is lower for most of these
  types (p5.48xlarge: 100) and higher for a few large ones (g5.48xlarge: 345, about 1 GiB more).

DaemonSets (CNI, kube-proxy, the FSx CSI node plugin) also take a share; the pod must fit what
is left after all of these, so the check is necessary, not sufficient.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "INSTANCE_TYPES_FILE",
    "Allocatable",
    "InstanceSpec",
    "allocatable",
    "instance_specs",
    "max_pods",
]

INSTANCE_TYPES_FILE = Path(__file__).resolve().parent / "instance_types.yaml"
EVICTION_MEMORY_MIB = 100


class InstanceSpec(BaseModel):
    """One EC2 instance type as AWS publishes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vcpus: int = Field(ge=1)
    memory_gib: int = Field(ge=1)
    gpus: int = Field(default=0, ge=0)
    gpu: str | None = None
    gpu_memory_gib: int | None = Field(default=None, ge=1, description="per GPU")


@dataclass(frozen=True)
class Allocatable:
    """What pods can request on a node of one type: millicores, MiB and GPUs."""

    cpu_milli: int
    memory_mib: int
    gpus: int


@cache
def instance_specs(path: Path = INSTANCE_TYPES_FILE) -> dict[str, InstanceSpec]:
    """Every supported instance type by name (``g6e.12xlarge``)."""
    document = yaml.safe_load(path.read_text()) or {}
    return {
        name: InstanceSpec.model_validate(spec)
        for name, spec in (document.get("instance_types") or {}).items()
    }


def max_pods(spec: InstanceSpec) -> int:
    """The pod limit the reserve is computed for (see the module docstring)."""
    return 110 if spec.vcpus < 30 else 250


def _reserved_cpu_milli(vcpus: int) -> float:
    cores = [60.0, 10.0, 5.0, 5.0]
    return sum(cores[:vcpus]) + 2.5 * max(0, vcpus - 4)


def allocatable(spec: InstanceSpec) -> Allocatable:
    """``spec``'s capacity less kube-reserved CPU and memory and the eviction threshold."""
    reserved_mib = 255 + 11 * max_pods(spec) + EVICTION_MEMORY_MIB
    return Allocatable(
        cpu_milli=int(spec.vcpus * 1000 - _reserved_cpu_milli(spec.vcpus)),
        memory_mib=spec.memory_gib * 1024 - reserved_mib,
        gpus=spec.gpus,
    )
