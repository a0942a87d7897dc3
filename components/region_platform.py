"""``RegionPlatform``: one region's cluster, GPU nodes, model cache and model services.

Red-Black models run as one ``RedBlackRollout`` wrapping ``ModelService``'s pod template;
Versioned models as one ``ModelService`` per version behind a ``VersionedModel``'s routes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.cluster_addons import ClusterAddons, ClusterAddonsArgs
from components.eks_cluster import ClusterHandles, adopt_cluster, create_cluster, kubeconfig
from components.gpu_node_group import DEVICE_PLUGIN_NODES, GpuNodeGroup, GpuNodeGroupArgs
from components.model_cache import ModelCache, ModelCacheArgs
from components.model_service import (
    ModelService,
    ModelServiceArgs,
    build_pod_template,
    serving_mode_from_manifest,
)
from components.naming import dns_label
from components.observability import Observability, ObservabilityArgs
from components.red_black import GatewayRef, RedBlackArgs, RedBlackRollout
from components.versioned import VersionedArgs, VersionedModel, VersionSpec, age_annotations
from runtime.metrics_proxy.assets import rollout_queries, rollout_success_conditions
from stacks.config import ModelConfig, ModelVersionConfig, RegionStackConfig

__all__ = ["DEFAULT_TOOLS_IMAGE", "Endpoints", "RegionPlatform", "RegionPlatformArgs"]

# The FSx CSI driver's image carries the Lustre client (``lfs``) that materialize jobs run.
DEFAULT_TOOLS_IMAGE = "public.ecr.aws/fsx-csi-driver/aws-fsx-csi-driver:v1.4.0"

ModelEndpoints = pulumi.Output[dict[str, str | None]]
"""``grpc``, ``openai`` (``None`` for standalone packages) and ``metrics`` of one version."""
Endpoints = dict[str, dict[str, ModelEndpoints]]


@dataclass(frozen=True)
class RegionPlatformArgs:
    """Inputs of a region: its typed stack configuration and what the global stack shares."""

    config: RegionStackConfig
    """The region stack's configuration."""
    image_repository_url: pulumi.Input[str]
    """The region's replica of the serving image repository."""
    bucket_name: pulumi.Input[str]
    """The region's model bucket."""
    dashboard: Mapping[str, Any] | None = None
    """Grafana dashboard of the metrics assets; ``None`` ships none."""
    alert_groups: Sequence[Mapping[str, Any]] | None = None
    """Prometheus rule groups of the metrics assets; ``None`` ships none."""
    tools_image: str = DEFAULT_TOOLS_IMAGE
    """Image with the Lustre client tools for materialize jobs."""
    vllm_version: str | None = None
    """vLLM of the image's Triton release (the compatibility matrix), annotated on pods."""
    analysis_queries: Mapping[str, str] = field(default_factory=rollout_queries)
    """Red-Black analysis PromQL (the metrics proxy's ``rollout_analysis.yaml``)."""
    analysis_success_conditions: Mapping[str, str] = field(
        default_factory=rollout_success_conditions
    )
    """Absolute success condition of the new colour for each analysis query."""


@dataclass(frozen=True)
class _Site:
    """What every model of the region is built on."""

    args: RegionPlatformArgs
    cache: ModelCache
    cluster: ClusterHandles
    image: pulumi.Output[str]
    after: list[pulumi.Resource]
    gateway: GatewayRef
    opts: pulumi.ResourceOptions


class RegionPlatform(pulumi.ComponentResource):
    """Creates or adopts the EKS cluster and composes the platform's components on it."""

    cluster_name: pulumi.Output[str]
    endpoints: Endpoints

    def __init__(
        self, name: str, args: RegionPlatformArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("llm-serving:region_platform:RegionPlatform", name, None, opts)
        self._name = name
        self._config = config = args.config
        cluster = (
            create_cluster(name, config, self)
            if config.cluster.mode == "create"
            else adopt_cluster(config, self)
        )
        node_sg = self._node_security_group(cluster)
        provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=kubeconfig(cluster, config.region),
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        on_cluster = pulumi.ResourceOptions(parent=self, providers={"kubernetes": provider})
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={"name": config.namespace},
            opts=pulumi.ResourceOptions(parent=self, provider=provider),
        )
        groups = [
            GpuNodeGroup(
                f"{name}-{group.name}",
                GpuNodeGroupArgs(
                    cluster_name=cluster.name,
                    subnet_ids=config.network.private_subnet_ids,
                    security_group_ids=[cluster.security_group_id, node_sg],
                    instance_types=group.instance_types,
                    min_size=group.min_size,
                    max_size=group.max_size,
                    desired_size=group.desired_size,
                    gpus_per_node=group.gpus_per_node,
                    ami_type=group.ami_type,
                    capacity_type=group.capacity_type,
                    root_volume_gib=group.root_volume_gib,
                    capacity_reservation_id=group.capacity_reservation_id,
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for group in config.node_groups
        ]
        needs_plugin = any(group.needs_device_plugin for group in groups)
        addons = ClusterAddons(
            f"{name}-addons",
            ClusterAddonsArgs(
                device_plugin_node_selector=DEVICE_PLUGIN_NODES if needs_plugin else None,
                gateway_namespace=config.namespace,
                depends_on=[namespace],
            ),
            opts=on_cluster,
        )
        served = [(m, v) for m in config.models for v in m.served_versions]
        cache = ModelCache(
            f"{name}-cache",
            ModelCacheArgs(
                vpc_id=config.network.vpc_id,
                subnet_id=config.network.private_subnet_ids[0],
                node_security_group_id=node_sg,
                bucket_name=args.bucket_name,
                namespace=config.namespace,
                versions=[(m.id, v.version) for m, v in served],
                tools_image=args.tools_image,
                storage_capacity_gib=config.model_cache.storage_capacity_gib,
                throughput_per_unit=config.model_cache.throughput_per_unit,
                restore_batch_size=config.model_cache.restore_batch_size,
                depends_on=[namespace, addons],
            ),
            opts=on_cluster,
        )
        image = pulumi.Output.concat(args.image_repository_url, ":", config.image.tag)
        site = _Site(
            args=args,
            cache=cache,
            cluster=cluster,
            image=image,
            after=[namespace, addons, *groups],
            gateway=GatewayRef(
                name=addons.gateway_name,
                namespace=addons.gateway_namespace,
                port=addons.gateway_port,
                tls=False,
            ),
            opts=on_cluster,
        )
        self.endpoints = {
            model.id: (
                self._red_black(model, site)
                if model.strategy == "red-black"
                else self._versioned(model, site)
            )
            for model in config.models
        }
        if args.dashboard is not None and args.alert_groups is not None:
            Observability(
                f"{name}-observability",
                ObservabilityArgs(
                    namespace=config.namespace,
                    dashboard=args.dashboard,
                    alert_groups=args.alert_groups,
                    depends_on=[namespace, addons],
                ),
                opts=on_cluster,
            )
        self.cluster_name = cluster.name
        self.register_outputs({"cluster_name": self.cluster_name, "endpoints": self.endpoints})

    def _red_black(self, model: ModelConfig, site: _Site) -> dict[str, ModelEndpoints]:
        """One ModelService (role, PDB, scraping, KEDA) around one Rollout for the last version;
        changing the version rolls the same resources out."""
        version = model.versions[-1]
        previous = model.versions[-2].version if len(model.versions) > 1 else None
        # The Rollout brings the workload and the stable/canary Services the routes need.
        service_args = self._service_args(
            model,
            version,
            site,
            service_name=dns_label(model.id),
            strategy="red-black",
            create_workload=False,
            create_service=False,
        )
        service = ModelService(f"{self._name}-{service_args.name}", service_args, opts=site.opts)
        rollout = RedBlackRollout(
            f"{self._name}-{service_args.name}",
            RedBlackArgs(
                model_id=model.id,
                version=version.version,
                previous_version=previous,
                pod_template=build_pod_template(service_args),
                namespace=self._config.namespace,
                gateway=site.gateway,
                queries=site.args.analysis_queries,
                success_conditions=site.args.analysis_success_conditions,
                prometheus_address=service_args.prometheus_url,
                replicas=service_args.replicas,
                hostnames=(f"{dns_label(model.id)}.{self._config.domain}",),
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

    def _versioned(self, model: ModelConfig, site: _Site) -> dict[str, ModelEndpoints]:
        """One ModelService (Deployment, Service, ...) per listed version, and a VersionedModel
        adding each version's routes and the weighted shared routes."""
        newest = model.versions[-1].version
        specs, services, service_args_list = [], [], []
        for version in model.versions:
            spec = VersionSpec(
                version=version.version,
                service_name=dns_label(model.id, version.version),
                route_weight=version.route_weight,
                created_at=None if version.created_at is None else version.created_at.isoformat(),
            )
            service_args = self._service_args(
                model,
                version,
                site,
                service_name=spec.service_name,
                strategy="versioned",
                service_annotations=age_annotations(spec, version.version == newest),
                depends_on=[site.cache.materialize_jobs[(model.id, version.version)]],
            )
            specs.append(spec)
            service_args_list.append(service_args)
            services.append(
                ModelService(f"{self._name}-{service_args.name}", service_args, opts=site.opts)
            )
        versioned = VersionedModel(
            f"{self._name}-{dns_label(model.id)}",
            VersionedArgs(
                model_id=model.id,
                versions=tuple(specs),
                namespace=self._config.namespace,
                gateway=site.gateway,
                domain=self._config.domain,
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
        self,
        model: ModelConfig,
        version: ModelVersionConfig,
        site: _Site,
        *,
        service_name: str,
        depends_on: Sequence[pulumi.Resource] | None = None,
        **overrides: Any,
    ) -> ModelServiceArgs:
        args = site.args
        manifest = aws.s3.get_object_output(
            bucket=args.bucket_name,
            key=f"models/{model.id}/{version.version}/manifest.json",
            opts=pulumi.InvokeOutputOptions(parent=self),
        )
        replicas = version.replicas if version.replicas is not None else model.replicas
        if depends_on is None:
            depends_on = [site.cache.materialize_jobs[(model.id, version.version)]]
        return ModelServiceArgs(
            model_id=model.id,
            version=version.version,
            namespace=args.config.namespace,
            image=site.image,
            serving_mode=manifest.body.apply(serving_mode_from_manifest),
            bucket_name=args.bucket_name,
            oidc_provider_arn=site.cluster.oidc_provider_arn,
            oidc_issuer=site.cluster.oidc_issuer,
            cache_claim_name=site.cache.claim_name,
            node_group=f"{self._name}-{model.node_group}",
            gpus=model.gpus,
            cpu=model.cpu,
            memory_gib=model.memory_gib,
            shm_gib=model.shm_gib,
            replicas=replicas,
            max_replicas=model.max_replicas,
            queue_target=model.queue_target,
            service_name=service_name,
            triton_release=args.config.image.triton_release,
            vllm_version=args.vllm_version,
            depends_on=[*depends_on, *site.after],
            **overrides,
        )

    def _node_security_group(self, cluster: ClusterHandles) -> pulumi.Input[str]:
        network = self._config.network
        if network.node_security_group_id is not None:
            return network.node_security_group_id
        group = aws.ec2.SecurityGroup(
            f"{self._name}-gpu-nodes",
            description="GPU nodes of llm-serving: model cache clients",
            vpc_id=network.vpc_id,
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{self._name}-gpu-nodes-from-cluster",
            security_group_id=group.id,
            referenced_security_group_id=cluster.security_group_id,
            ip_protocol="-1",
            description="control plane and other nodes",
            opts=pulumi.ResourceOptions(parent=group),
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{self._name}-gpu-nodes-out",
            security_group_id=group.id,
            cidr_ipv4="0.0.0.0/0",
            ip_protocol="-1",
            description="image pulls, S3, the Lustre servers",
            opts=pulumi.ResourceOptions(parent=group),
        )
        return group.id


def _with_serving_mode(urls: pulumi.Input[Any], args: ModelServiceArgs) -> ModelEndpoints:
    """The route's endpoints, without ``openai`` for packages that serve no OpenAI frontend."""
    return pulumi.Output.all(urls, args.serving_mode).apply(
        lambda values: {
            **values[0],
            "openai": values[0]["openai"] if values[1] == "embedded" else None,
        }
    )
