"""How a region's models become services, by strategy (glue from ``ModelConfig`` to components).

A Red-Black model is one ``RedBlackRollout`` around ``ModelService``'s pod template for its last
listed version (the ``ModelService`` keeping role, PDB, scraping and KEDA); a Versioned model is
one ``ModelService`` per listed version behind a ``VersionedModel``'s routes. Both give each
served version's endpoints under the same naming, ``endpoints[<model>][<version>]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from components.eks_cluster import ClusterHandles
from components.gateway import GatewayRef, route_hosts
from components.model_cache import ModelCache
from components.model_service import (
    ModelService,
    ModelServiceArgs,
    RolloutWorkload,
    build_pod_template,
)
from components.model_service.args import ScalingTrigger, serving_mode_from_manifest
from components.red_black import RedBlackArgs, RedBlackRollout
from components.versioned import VersionedArgs, VersionedModel, VersionSpec, age_annotations
from contracts.naming import dns_label
from stacks.config import ModelConfig, ModelVersionConfig, RegionStackConfig

__all__ = ["ModelEndpoints", "ModelSite", "red_black_model", "versioned_model"]

ModelEndpoints = pulumi.Output[dict[str, str | None]]
"""``grpc``, ``openai`` (``None`` for standalone packages) and ``metrics`` of one version."""


@dataclass(frozen=True)
class ModelSite:
    """What every model of a region is built on."""

    prefix: str
    """Prefix of the resource names (the region platform's name)."""
    parent: pulumi.Resource
    """Parent of the provider calls (each version's ``manifest.json``)."""
    config: RegionStackConfig
    """The region stack's configuration."""
    image: pulumi.Input[str]
    """The serving image."""
    bucket_name: pulumi.Input[str]
    """The region's model bucket."""
    cluster: ClusterHandles
    """The cluster (its OIDC provider for IRSA)."""
    cache: ModelCache
    """The model cache: its read-only claim, and each version's materialize Job."""
    after: Sequence[pulumi.Resource]
    """What every model's objects wait for: namespace, add-ons (CRDs), node groups."""
    gateway: GatewayRef
    """The shared Gateway the routes attach to."""
    opts: pulumi.ResourceOptions
    """Options of the components (parent, Kubernetes provider)."""
    vllm_version: str | None
    """vLLM of the image's Triton release, annotated on pods."""
    analysis_queries: Mapping[str, str]
    """Red-Black analysis PromQL by name."""
    analysis_success_conditions: Mapping[str, str]
    """Absolute success condition of the new colour for each analysis query."""


def red_black_model(site: ModelSite, model: ModelConfig) -> dict[str, ModelEndpoints]:
    """One ModelService (role, PDB, scraping, KEDA) around one Rollout for the last version;
    changing the version rolls the same resources out."""
    version = model.versions[-1]
    hosts = route_hosts((dns_label(model.id),), site.config.domain)
    previous = model.versions[-2].version if len(model.versions) > 1 else None
    # The Rollout brings the workload and the stable/canary Services the routes need.
    service_args = _service_args(
        model,
        version,
        site,
        service_name=dns_label(model.id),
        strategy="red-black",
        rollout=RolloutWorkload(),
        also_reads=() if previous is None else (previous,),
    )
    service = ModelService(f"{site.prefix}-{service_args.name}", service_args, opts=site.opts)
    rollout = RedBlackRollout(
        f"{site.prefix}-{service_args.name}",
        RedBlackArgs(
            model_id=model.id,
            version=version.version,
            pod_template=build_pod_template(service_args),
            namespace=site.config.namespace,
            gateway=site.gateway,
            queries=site.analysis_queries,
            success_conditions=site.analysis_success_conditions,
            prometheus_address=service_args.prometheus_url,
            replicas=service_args.replicas,
            hostnames=(hosts.http,),
            grpc_hostnames=(hosts.grpc,),
            name=service_args.name,
            scaled_externally=model.max_replicas is not None,
            depends_on=[
                site.cache.materialize_jobs[(model.id, version.version)],
                service,
                *site.after,
            ],
        ),
        opts=site.opts,
    )
    return {version.version: _with_serving_mode(rollout.endpoints, service_args)}


def versioned_model(site: ModelSite, model: ModelConfig) -> dict[str, ModelEndpoints]:
    """One ModelService (Deployment, Service, ...) per listed version, and a VersionedModel
    adding each version's routes and the weighted shared routes."""
    newest = model.versions[-1].version
    specs, services, service_args_list = [], [], []
    for version in model.versions:
        service_name = dns_label(model.id, version.version)
        spec = VersionSpec(
            version=version.version,
            service_name=service_name,
            route_weight=version.route_weight,
            created_at=None if version.created_at is None else version.created_at.isoformat(),
        )
        service_args = _service_args(
            model,
            version,
            site,
            service_name=service_name,
            strategy="versioned",
            service_annotations=age_annotations(spec, version.version == newest),
        )
        specs.append(spec)
        service_args_list.append(service_args)
        services.append(
            ModelService(f"{site.prefix}-{service_args.name}", service_args, opts=site.opts)
        )
    versioned = VersionedModel(
        f"{site.prefix}-{dns_label(model.id)}",
        VersionedArgs(
            model_id=model.id,
            versions=tuple(specs),
            namespace=site.config.namespace,
            gateway=site.gateway,
            domain=site.config.domain,
            depends_on=[*services, *site.after],
        ),
        opts=site.opts,
    )
    return {
        version: _with_serving_mode(urls, service_args)
        for (version, urls), service_args in zip(
            versioned.endpoints.items(), service_args_list, strict=True
        )
    }


def _service_args(
    model: ModelConfig,
    version: ModelVersionConfig,
    site: ModelSite,
    *,
    service_name: str,
    **overrides: Any,
) -> ModelServiceArgs:
    """One version's ModelService arguments; its objects wait for the version's materialize
    Job and what every model waits for."""
    manifest = aws.s3.get_object_output(
        bucket=site.bucket_name,
        key=f"models/{model.id}/{version.version}/manifest.json",
        opts=pulumi.InvokeOutputOptions(parent=site.parent),
    )
    replicas = version.replicas if version.replicas is not None else model.replicas
    return ModelServiceArgs(
        model_id=model.id,
        version=version.version,
        namespace=site.config.namespace,
        image=site.image,
        serving_mode=manifest.body.apply(serving_mode_from_manifest),
        bucket_name=site.bucket_name,
        oidc_provider_arn=site.cluster.oidc_provider_arn,
        oidc_issuer=site.cluster.oidc_issuer,
        cache_claim_name=site.cache.claim_name,
        node_group=f"{site.prefix}-{model.node_group}",
        gpus=model.gpus,
        cpu=model.cpu,
        memory_gib=model.memory_gib,
        shm_gib=model.shm_gib,
        replicas=replicas,
        max_replicas=model.max_replicas,
        scaling=ScalingTrigger(metric=model.trigger.metric, target=model.trigger.target),
        service_name=service_name,
        triton_release=site.config.image.triton_release,
        vllm_version=site.vllm_version,
        api_keys_secret=model.api_keys_secret,
        depends_on=[site.cache.materialize_jobs[(model.id, version.version)], *site.after],
        **overrides,
    )


def _with_serving_mode(urls: pulumi.Input[Any], args: ModelServiceArgs) -> ModelEndpoints:
    """The route's endpoints, without ``openai`` for packages that serve no OpenAI frontend."""
    return pulumi.Output.all(urls, args.serving_mode).apply(
        lambda values: {
            **values[0],
            "openai": values[0]["openai"] if values[1] == "embedded" else None,
        }
    )
