"""The offline plan: what ``pulumi up`` would create for a stack, without credentials or a cloud.

It runs the real stack program under Pulumi's mock engine (:mod:`stacks.mock_engine`) with the
stack's configuration, prints the resource tree with the properties a reviewer cares about,
writes every Kubernetes object as YAML and validates it, and with ``against`` prints the
difference from the plan of another git revision, resource by resource.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stacks import mock_engine
from stacks.config import (
    GLOBAL_STACK,
    STACKS_DIR,
    RegionStackConfig,
    StackConfigError,
    load_stack_config,
    region_entry,
    stack_file,
    vllm_version_for,
)
from stacks.kubernetes_objects import (
    DEFAULT_KUBERNETES_VERSION,
    KubernetesSchemaError,
    Validation,
    write_objects,
)
from stacks.mock_engine import (
    COMPUTED,
    MOCK_ACCOUNT,
    DuplicateURNError,
    PlanMocks,
    ProgramRun,
    RecordedResource,
)
from stacks.plan_checks import CHECKS, Finding, check_plan

__all__ = [
    "KEY_PROPERTIES",
    "PlanError",
    "PlanReport",
    "diff_runs",
    "global_outputs",
    "plan_program",
    "run_plan",
]

REPO_ROOT = STACKS_DIR.parent
DEFAULT_OUT = REPO_ROOT / "plan-out"
# Properties shown in the tree, per resource type (dotted paths into the inputs).
KEY_PROPERTIES: dict[str, tuple[str, ...]] = {
    "aws:eks/cluster:Cluster": ("name", "version", "accessConfig.authenticationMode"),
    "aws:eks/nodeGroup:NodeGroup": (
        "amiType",
        "version",
        "releaseVersion",
        "capacityType",
        "instanceTypes",
        "subnetIds",
        "scalingConfig",
        "taints",
    ),
    "aws:ec2/launchTemplate:LaunchTemplate": (
        "metadataOptions.httpTokens",
        "blockDeviceMappings",
        "vpcSecurityGroupIds",
    ),
    "aws:fsx/lustreFileSystem:LustreFileSystem": (
        "deploymentType",
        "storageCapacity",
        "perUnitStorageThroughput",
        "kmsKeyId",
    ),
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": (
        "dataRepositoryPath",
        "fileSystemPath",
        "s3",
    ),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": (
        "ipProtocol",
        "fromPort",
        "toPort",
        "referencedSecurityGroupId",
        "cidrIpv4",
    ),
    "aws:iam/rolePolicy:RolePolicy": ("policy.Statement[].Action", "policy.Statement[].Resource"),
    "aws:iam/role:Role": ("assumeRolePolicy.Statement[].Condition",),
    "aws:ecr/repository:Repository": ("name", "imageTagMutability"),
    "aws:s3/bucketReplicationConfig:BucketReplicationConfig": ("rules",),
    "kubernetes:helm.sh/v3:Release": ("chart", "version", "namespace"),
    "kubernetes:apps/v1:Deployment": (
        "metadata.namespace",
        "spec.replicas",
        "spec.template.spec.containers[].image",
        "spec.template.spec.containers[].resources.limits",
        "spec.template.spec.nodeSelector",
        "spec.template.metadata.annotations",
    ),
    "kubernetes:argoproj.io/v1alpha1:Rollout": (
        "metadata.namespace",
        "metadata.annotations.llm-serving/model-version",
        "spec.replicas",
        "spec.template.spec.containers[].image",
        "spec.template.spec.containers[].resources.limits",
        "spec.template.metadata.annotations",
        "spec.strategy.canary.steps[].setWeight",
    ),
    "kubernetes:gateway.networking.k8s.io/v1:GRPCRoute": (
        "spec.hostnames",
        "spec.rules[].backendRefs[].weight",
    ),
    "kubernetes:gateway.networking.k8s.io/v1:HTTPRoute": (
        "spec.hostnames",
        "spec.rules[].backendRefs[].weight",
        "spec.rules[].timeouts.request",
    ),
    "kubernetes:gateway.envoyproxy.io/v1alpha1:BackendTrafficPolicy": (
        "spec.targetRefs[].name",
        "spec.timeout.http.requestTimeout",
    ),
    "kubernetes:batch/v1:Job": ("metadata.namespace", "spec.template.spec.containers[].image"),
    "kubernetes:core/v1:Service": ("metadata.namespace", "spec.ports[].port"),
    "kubernetes:keda.sh/v1alpha1:ScaledObject": (
        "spec.scaleTargetRef.kind",
        "spec.minReplicaCount",
        "spec.maxReplicaCount",
        "spec.triggers[].metadata.query",
    ),
    "pulumi:pulumi:StackReference": ("name",),
}


class PlanError(Exception):
    """The plan cannot be made; the message says what to change."""


@dataclass
class PlanReport:
    """What one plan found."""

    stack: str
    run: ProgramRun
    validations: list[Validation] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    """What the cross-object checks (:mod:`stacks.plan_checks`) found."""
    differences: list[str] | None = None
    seconds: float = 0.0

    @property
    def invalid(self) -> list[Validation]:
        """Objects that failed validation."""
        return [v for v in self.validations if v.error is not None]


def global_outputs(stacks_dir: Path = STACKS_DIR) -> dict[str, Any]:
    """Stand-ins for the global stack's outputs, shaped as the global program exports them."""
    config = mock_engine.stack_config_strings(stacks_dir / f"Pulumi.{GLOBAL_STACK}.yaml")
    regions = [config.get("aws:region", "us-east-1")]
    regions += json.loads(config.get("llm-serving:replica_regions", "[]"))
    repository = config.get("llm-serving:image_repository", "llm-serving/triton-vllm")
    return {
        "image_repository_urls": {
            r: f"{MOCK_ACCOUNT}.dkr.ecr.{r}.amazonaws.com/{repository}" for r in regions
        },
        "model_buckets": {r: f"llm-serving-models-{r}" for r in regions},
    }


def plan_program(stack: str, root: Path = REPO_ROOT) -> ProgramRun:
    """Run this checkout's stack program for ``stack`` under the mock engine."""
    stacks_dir = root / "stacks"
    return mock_engine.run_program(
        stacks_dir / "__main__.py",
        stack,
        mock_engine.stack_config_strings(stack_file(stack, stacks_dir)),
        PlanMocks(global_outputs(stacks_dir)),
    )


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _lookup(value: Any, path: str) -> Any:
    """The value at a dotted path; ``name[]`` maps the rest of the path over a list, and a
    JSON document held in a string (an IAM policy) is looked into."""
    if isinstance(value, str) and value.startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    head, _, rest = path.partition(".")
    many = head.endswith("[]")
    key = head.removesuffix("[]")
    if not isinstance(value, Mapping) or key not in value:
        return None
    found = value[key]
    if many:
        if not isinstance(found, list):
            return None
        return [_lookup(item, rest) if rest else item for item in found]
    return _lookup(found, rest) if rest else found


def _without_gaps(value: Any) -> Any:
    """A path's values without the list items that lack it (Rollout steps other than
    ``setWeight``, route backends without a weight)."""
    if not isinstance(value, list):
        return value
    kept = [_without_gaps(item) for item in value]
    return [item for item in kept if item is not None and item != []]


def format_tree(run: ProgramRun) -> list[str]:
    """The resource tree: one line per resource (type, name), its key properties below it."""
    children: dict[str, list[RecordedResource]] = {}
    urns = {r.urn for r in run.resources}
    for resource in run.resources:
        parent = resource.parent if resource.parent in urns else ""
        children.setdefault(parent, []).append(resource)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for resource in sorted(children.get(parent, []), key=lambda r: (r.type, r.name)):
            indent = "  " * depth
            lines.append(f"{indent}+ {resource.type}  {resource.name}")
            for path in KEY_PROPERTIES.get(resource.type, ()):
                value = _without_gaps(_lookup(resource.inputs, path))
                if value not in (None, []):
                    lines.append(f"{indent}    {path}: {_short(value)}")
            walk(resource.urn, depth + 1)

    walk("", 0)
    return lines


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        flat: dict[str, Any] = {}
        for key in sorted(value):
            flat.update(_flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(value, list):
        flat = {}
        for i, item in enumerate(value):
            flat.update(_flatten(item, f"{prefix}[{i}]"))
        return flat or {prefix: []}
    return {prefix: value}


def _compared(resource: RecordedResource) -> dict[str, Any]:
    """A resource's inputs and engine options (``(option) protect``), flattened to paths."""
    options = _flatten(resource.options)
    return {**_flatten(resource.inputs), **{f"(option) {k}": v for k, v in options.items()}}


def diff_runs(before: ProgramRun, after: ProgramRun) -> list[str]:
    """Per-resource differences between two plans: ``+`` added, ``-`` removed, ``~`` changed."""
    old = {r.key: r for r in before.resources}
    new = {r.key: r for r in after.resources}
    lines = []
    for key in sorted(old.keys() | new.keys()):
        if key not in old:
            lines.append(f"+ {key.replace('::', '  ')}")
        elif key not in new:
            lines.append(f"- {key.replace('::', '  ')}")
        else:
            a, b = _compared(old[key]), _compared(new[key])
            changed = [p for p in sorted(a.keys() | b.keys()) if a.get(p) != b.get(p)]
            if changed:
                lines.append(f"~ {key.replace('::', '  ')}")
                for path in changed:
                    lines.append(
                        f"    {path}: {_short(a.get(path, '(absent)'), 70)} -> "
                        f"{_short(b.get(path, '(absent)'), 70)}"
                    )
    for name in sorted(before.outputs.keys() | after.outputs.keys()):
        if before.outputs.get(name) != after.outputs.get(name):
            lines.append(f"~ output {name}")
    return lines


def _plan_revision(ref: str, stack: str) -> ProgramRun:
    """Plan ``stack`` as revision ``ref`` left it, in a fresh process on a temporary checkout."""
    with tempfile.TemporaryDirectory(prefix="llm-serving-plan-") as tmp:
        root = Path(tmp) / "checkout"
        root.mkdir()
        archive = Path(tmp) / "revision.tar"
        # An exported tree, not a worktree: it leaves no trace in the repository's metadata.
        result = subprocess.run(
            ["git", "archive", "--format=tar", "-o", str(archive), ref],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise PlanError(f"--against {ref}: git cannot read that revision: {result.stderr}")
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
        out = Path(tmp) / "run.json"
        process = subprocess.run(
            [
                sys.executable,
                str(Path(mock_engine.__file__)),
                str(root),
                stack,
                json.dumps(global_outputs()),
                str(out),
            ],
            cwd=root,
            capture_output=True,
            text=True,
        )
        if process.returncode != 0:
            tail = "\n".join(process.stderr.strip().splitlines()[-5:])
            raise PlanError(f"--against {ref}: that revision's program failed:\n{tail}")
        data = json.loads(out.read_text())
    return ProgramRun(
        resources=[RecordedResource(**r) for r in data["resources"]], outputs=data["outputs"]
    )


def run_plan(
    stack: str,
    out: Path | None = None,
    against: str | None = None,
    echo: Callable[[str], None] = print,
) -> PlanReport:
    """Plan ``stack``: print the tree, write and validate Kubernetes objects, diff ``against``."""
    start = time.perf_counter()
    stages = 5 if against else 4
    try:
        config = load_stack_config(stack)
        if isinstance(config, RegionStackConfig):
            vllm_version_for(config, stack)
            # What `pulumi up` finds out only once the global stack's outputs arrive.
            for by_region in global_outputs().values():
                region_entry(by_region, config, stack)
    except StackConfigError as exc:
        raise PlanError(str(exc)) from exc
    described = "global stack"
    version = DEFAULT_KUBERNETES_VERSION
    if isinstance(config, RegionStackConfig):
        versions = sum(len(m.served_versions) for m in config.models)
        described = f"{len(config.models)} models, {versions} served versions"
        version = config.cluster.version
    echo(f"[1/{stages}] config: {stack_file(stack)} is valid ({described})")
    try:
        run = plan_program(stack)
    except (StackConfigError, DuplicateURNError) as exc:
        raise PlanError(str(exc)) from exc
    echo(
        f"[2/{stages}] program: {len(run.resources)} resources declared under the mock engine "
        f"({time.perf_counter() - start:.1f} s); cloud-computed values show as {COMPUTED}, "
        f"global stack outputs and package manifests are stand-ins"
    )
    for line in format_tree(run):
        echo(line)
    # One line per leaf, so that each endpoint of each model version reads on its own.
    for name, value in sorted(run.outputs.items()):
        for path, leaf in _flatten(value, name).items():
            echo(f"output {path}: {json.dumps(leaf)}")
    report = PlanReport(stack=stack, run=run)
    out_dir = (out or DEFAULT_OUT) / stack
    # Objects of an earlier plan must not pass for this plan's.
    shutil.rmtree(out_dir, ignore_errors=True)
    try:
        report.validations = write_objects(run, out_dir, version)
    except KubernetesSchemaError as exc:
        raise PlanError(str(exc)) from exc
    strict = sum(v.schema for v in report.validations)
    echo(
        f"[3/{stages}] kubernetes: wrote {len(report.validations)} objects under {out_dir}; "
        f"{strict} built-in objects validated strictly against the Kubernetes {version} schema, "
        f"{len(report.validations) - strict} custom resources (no CRD schema offline) checked "
        f"for apiVersion, kind and metadata.name"
    )
    for invalid in report.invalid:
        echo(f"INVALID {invalid.path}: {invalid.error}")
    report.findings = check_plan(run)
    echo(
        f"      cross-object checks ({', '.join(CHECKS)}): {len(report.findings) or 'no'} problems"
    )
    for finding in report.findings:
        echo(f"PROBLEM {finding.check}: {finding.message}")
    if against:
        before = _plan_revision(against, stack)
        report.differences = diff_runs(before, run)
        echo(f"[4/{stages}] against {against}: {len(report.differences)} difference lines")
        for line in report.differences:
            echo(line)
    report.seconds = time.perf_counter() - start
    echo(f"[{stages}/{stages}] done in {report.seconds:.1f} s")
    if report.invalid:
        raise PlanError(f"{len(report.invalid)} Kubernetes objects failed validation")
    if report.findings:
        raise PlanError(f"{len(report.findings)} cross-object problems (PROBLEM lines above)")
    return report
