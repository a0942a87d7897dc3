"""``RegionPlatform``: one region's cluster, its nodes, model cache and model services.

The glue between a region stack's configuration and the components: it reads
``RegionStackConfig`` and hands each component its typed ``Args``.

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
from components.cpu_node_group import CpuNodeGroup, CpuNodeGroupArgs
from components.eks_cluster import (
    ClusterArgs,
    ClusterHandles,
    adopt_cluster,
    create_cluster,
    create_ebs_csi_driver,
    kubeconfig,
)
from components.gateway import GatewayRef
from components.gpu_node_group import (
    DEVICE_PLUGIN_NODES,
    NODE_GROUP_LABEL,
    GpuNodeGroup,
    GpuNodeGroupArgs,
)
from components.model_cache import ModelCache, ModelCacheArgs
from components.observability import Observability, ObservabilityArgs
from components.system_node_group import SystemNodeGroup, SystemNodeGroupArgs
from contracts.promql import rollout_queries, rollout_success_conditions
from stacks.config import RegionStackConfig
from stacks.model_strategies import ModelEndpoints, ModelSite, red_black_model, versioned_model

__all__ = ["Endpoints", "RegionPlatform", "RegionPlatformArgs"]

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
    vllm_version: str | None = None
    """vLLM of the image's Triton release (the compatibility matrix), annotated on pods."""
    analysis_queries: Mapping[str, str] = field(default_factory=rollout_queries)
    """Red-Black analysis PromQL templates (``contracts/promql/rollout_analysis.yaml``)."""
    analysis_success_conditions: Mapping[str, str] = field(
        default_factory=rollout_success_conditions
    )
    """Absolute success condition of the new colour for each analysis query."""


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
        # A created cluster gets untainted nodes for add-ons and controllers and the EBS CSI
        # driver for Prometheus's volume; an adopted cluster brings its own.
        system_nodes: list[pulumi.Resource] = []
        storage_driver: list[pulumi.Resource] = []
        if config.cluster.mode == "create":
            assert config.cluster.public_access_cidrs is not None  # required when created
            cluster_args = ClusterArgs(
                name=config.cluster.name,
                version=config.cluster.version,
                subnet_ids=config.network.private_subnet_ids,
                public_access_cidrs=config.cluster.public_access_cidrs,
            )
            cluster = create_cluster(name, cluster_args, self)
            system_nodes.append(self._create_system_nodes(cluster))
            storage_driver.append(create_ebs_csi_driver(name, cluster, system_nodes, self))
        else:
            cluster = adopt_cluster(config.cluster.name, self)
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
                    # A Capacity Block lives in one Availability Zone: only its subnet.
                    subnet_ids=config.network.private_subnet_ids
                    if group.subnet_id is None
                    else [group.subnet_id],
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
                    kubernetes_version=cluster.version,
                    release_version=group.release_version,
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for group in config.node_groups
        ]
        cpu_groups = [
            CpuNodeGroup(
                f"{name}-{group.name}",
                CpuNodeGroupArgs(
                    cluster_name=cluster.name,
                    subnet_ids=config.network.private_subnet_ids,
                    # Their pods mount the model cache, whose Lustre servers admit node_sg.
                    security_group_ids=[cluster.security_group_id, node_sg],
                    instance_types=group.instance_types,
                    min_size=group.min_size,
                    max_size=group.max_size,
                    desired_size=group.desired_size,
                    ami_type=group.ami_type,
                    capacity_type=group.capacity_type,
                    root_volume_gib=group.root_volume_gib,
                    kubernetes_version=cluster.version,
                    release_version=group.release_version,
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for group in config.cpu_node_groups
        ]
        needs_plugin = any(group.needs_device_plugin for group in groups)
        addons = ClusterAddons(
            f"{name}-addons",
            ClusterAddonsArgs(
                device_plugin_node_selector=DEVICE_PLUGIN_NODES if needs_plugin else None,
                gateway_namespace=config.namespace,
                prometheus_storage_gib=config.observability.prometheus_storage_gib,
                depends_on=[namespace],
                nodes=system_nodes,
                storage_driver=storage_driver,
            ),
            opts=on_cluster,
        )
        served = [(m, v) for m in config.models for v in m.served_versions]
        # One image for the servers and the materialize Jobs' verification of their weights.
        image = pulumi.Output.concat(args.image_repository_url, ":", config.image.tag)
        cache = ModelCache(
            f"{name}-cache",
            ModelCacheArgs(
                vpc_id=config.network.vpc_id,
                subnet_id=config.cache_subnet_id,
                node_security_group_id=node_sg,
                bucket_name=args.bucket_name,
                namespace=config.namespace,
                versions=[(m.id, v.version) for m, v in served],
                serving_image=image,
                client_node_groups=[group.labels[NODE_GROUP_LABEL] for group in groups],
                storage_capacity_gib=config.model_cache.storage_capacity_gib,
                throughput_per_unit=config.model_cache.throughput_per_unit,
                verify_jobs=config.model_cache.verify_jobs,
                depends_on=[namespace, addons],
            ),
            opts=on_cluster,
        )
        site = ModelSite(
            prefix=name,
            parent=self,
            config=config,
            image=image,
            bucket_name=args.bucket_name,
            cluster=cluster,
            cache=cache,
            after=[namespace, addons, *system_nodes, *groups, *cpu_groups],
            gateway=GatewayRef(
                name=addons.gateway_name,
                namespace=addons.gateway_namespace,
                port=addons.gateway_port,
                tls=False,
            ),
            opts=on_cluster,
            vllm_version=args.vllm_version,
            analysis_queries=args.analysis_queries,
            analysis_success_conditions=args.analysis_success_conditions,
        )
        self.endpoints = {
            model.id: (red_black_model if model.strategy == "red-black" else versioned_model)(
                site, model
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

    def _create_system_nodes(self, cluster: ClusterHandles) -> SystemNodeGroup:
        sizes = self._config.cluster.system_nodes
        return SystemNodeGroup(
            f"{self._name}-system",
            SystemNodeGroupArgs(
                cluster_name=cluster.name,
                subnet_ids=self._config.network.private_subnet_ids,
                instance_types=sizes.instance_types,
                min_size=sizes.min_size,
                max_size=sizes.max_size,
                desired_size=sizes.desired_size,
                kubernetes_version=cluster.version,
                release_version=sizes.release_version,
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _node_security_group(self, cluster: ClusterHandles) -> pulumi.Input[str]:
        network = self._config.network
        if network.node_security_group_id is not None:
            return network.node_security_group_id
        # CPU model nodes carry it too; the description stays, as changing it replaces the group.
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
