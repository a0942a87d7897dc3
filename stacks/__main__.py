"""The stack program: read this stack's configuration, compose the components, export outputs.

``global`` holds what regions share; every other stack is one region and reads the global
stack's outputs through a ``StackReference``.
"""

from __future__ import annotations

import pulumi

from components.shared_artifacts import SharedArtifacts, SharedArtifactsArgs
from contracts.promql import load_alert_groups, load_dashboard
from stacks.config import (
    GLOBAL_STACK,
    NAMESPACE,
    GlobalStackConfig,
    RegionStackConfig,
    load_stack_config,
    region_entry,
    vllm_version_for,
)
from stacks.region_platform import RegionPlatform, RegionPlatformArgs

stack = pulumi.get_stack()
settings = pulumi.Config(NAMESPACE)
aws_settings = pulumi.Config("aws")


def _get(key: str) -> str | None:
    namespace, _, name = key.partition(":")
    return (aws_settings if namespace == "aws" else settings).get(name)


def _this_region(
    shared: pulumi.StackReference, output: str, region_config: RegionStackConfig
) -> pulumi.Output[str]:
    # Known only once the global stack's outputs arrive: a region it lacks fails there.
    return shared.require_output(output).apply(
        lambda by_region: region_entry(by_region, region_config, stack)
    )


def _configured_keys() -> set[str]:
    # pulumi.Config cannot list keys. The language host passes the whole stack configuration as
    # JSON in PULUMI_CONFIG; the Automation API and the mock engine set it in-process instead.
    return set(pulumi.runtime.get_config_env()) | set(pulumi.runtime.config.CONFIG.get())


config = load_stack_config(stack, get=_get, configured=_configured_keys())

if isinstance(config, GlobalStackConfig):
    shared = SharedArtifacts(
        GLOBAL_STACK,
        SharedArtifactsArgs(
            publishing_region=config.region,
            replica_regions=config.replica_regions,
            image_repository=config.image_repository,
        ),
    )
    pulumi.export("image_repository_urls", shared.image_repository_urls)
    pulumi.export("model_buckets", shared.model_buckets)
else:
    # Before anything is declared: an unknown Triton release fails naming the key.
    vllm_version = vllm_version_for(config, stack)
    shared_outputs = pulumi.StackReference(config.global_stack)
    platform = RegionPlatform(
        stack,
        RegionPlatformArgs(
            config=config,
            image_repository_url=_this_region(shared_outputs, "image_repository_urls", config),
            bucket_name=_this_region(shared_outputs, "model_buckets", config),
            vllm_version=vllm_version,
            dashboard=load_dashboard(),
            alert_groups=load_alert_groups(),
        ),
    )
    pulumi.export("cluster_name", platform.cluster_name)
    pulumi.export("endpoints", platform.endpoints)
