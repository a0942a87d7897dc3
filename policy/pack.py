"""The CrossGuard policies: each wraps one validator and reports its messages as violations.

Imports ``pulumi_policy``, so it runs only in the pack's own virtualenv (``.venv-policy``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from contracts.compat import load_matrix
from policy import aws, versions, workloads
from policy.findings import Props

__all__ = ["PACK_NAME", "build_policies"]

PACK_NAME = "llm-serving-platform"

Validator = Callable[[str, Props], list[str]]


def _wrap(validator: Validator) -> Callable[[ResourceValidationArgs, ReportViolation], None]:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in validator(args.resource_type, args.props):
            report_violation(message, None)

    return validate


def _mandatory(name: str, description: str, validator: Validator) -> ResourceValidationPolicy:
    return ResourceValidationPolicy(
        name=name,
        description=description,
        validate=_wrap(validator),
        enforcement_level=EnforcementLevel.MANDATORY,
    )


def _versioned_age_policy() -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        hours = float(args.get_config().get("idleWindowHours", 24))
        for message in versions.check_versioned_age(
            args.resource_type, args.props, idle=timedelta(hours=hours), now=datetime.now(UTC)
        ):
            report_violation(message, None)

    return ResourceValidationPolicy(
        name="versioned-older-than-idle-window",
        description="Versioned deployments older than the idle window are candidates for gc.",
        validate=validate,
        enforcement_level=EnforcementLevel.ADVISORY,
        config_schema=PolicyConfigSchema(
            properties={"idleWindowHours": {"type": "number", "default": 24, "minimum": 1}}
        ),
    )


def _stack_resource(resource: PolicyResource) -> aws.StackResource:
    return aws.StackResource(
        urn=resource.urn,
        type=resource.resource_type,
        name=resource.name,
        props=resource.props,
        property_dependencies={
            key: [r.urn for r in deps] for key, deps in resource.property_dependencies.items()
        },
    )


def _gpu_launch_templates_policy() -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = [_stack_resource(r) for r in args.resources]
        for resource in resources:
            try:
                messages = aws.check_gpu_launch_template_tainted(resource, resources)
            except UnknownValueError:
                # Not known until the update, when the stack is analysed again; one node group's
                # unknown values must not skip the others.
                continue
            for message in messages:
                report_violation(message, resource.urn)

    return StackValidationPolicy(
        name="gpu-launch-template-node-groups-tainted",
        description="Node groups whose launch template has a GPU instance type carry the "
        "nvidia.com/gpu NoSchedule taint.",
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
    )


def build_policies(compat_path: Path | None = None) -> list[Policy]:
    """Every policy of the pack; ``compat_path`` overrides ``images/compat.toml``."""
    pairs = load_matrix(compat_path).supported

    def serving_pair(resource_type: str, props: Props) -> list[str]:
        return workloads.check_serving_pair_supported(resource_type, props, pairs)

    return [
        _mandatory(
            "gpu-node-groups-tainted",
            "GPU node groups carry the nvidia.com/gpu NoSchedule taint.",
            aws.check_gpu_node_group_tainted,
        ),
        _gpu_launch_templates_policy(),
        _mandatory(
            "gpu-pods-tolerate-taint",
            "Pods requesting nvidia.com/gpu tolerate the GPU taint.",
            workloads.check_gpu_pods_tolerate_taint,
        ),
        _mandatory(
            "gpu-containers-startup-probe",
            "GPU containers have a startup probe sized for cold starts.",
            workloads.check_gpu_startup_probes,
        ),
        _mandatory(
            "images-pinned",
            "Images are pinned by digest or release tag, never latest.",
            workloads.check_images_pinned,
        ),
        _mandatory(
            "serving-pair-in-compat-matrix",
            "The serving image's Triton/vLLM pair is listed in images/compat.toml.",
            serving_pair,
        ),
        _mandatory(
            "fsx-encrypted",
            "FSx for Lustre is PERSISTENT and encrypted with a KMS key.",
            aws.check_fsx_encrypted,
        ),
        _mandatory(
            "lustre-not-public",
            "No security group opens the Lustre ports to the internet.",
            aws.check_lustre_not_public,
        ),
        _mandatory(
            "imdsv2-required",
            "Launch templates and instances require IMDSv2.",
            aws.check_imdsv2_required,
        ),
        _mandatory(
            "irsa-trust-scoped",
            "IRSA roles trust exactly one service account.",
            aws.check_irsa_trust_scoped,
        ),
        _mandatory(
            "s3-access-scoped-to-prefix",
            "S3 permissions are scoped to a key prefix.",
            aws.check_s3_access_scoped_to_prefix,
        ),
        _mandatory(
            "red-black-steps-end-at-100-with-analysis",
            "Red-Black rollouts end at weight 100 and analyse every step.",
            workloads.check_red_black_steps,
        ),
        _versioned_age_policy(),
    ]
