"""``RegionPlatform``: one region's cluster, GPU nodes, model cache and model services."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.cluster_addons import ClusterAddons, ClusterAddonsArgs
from components.gpu_node_group import GpuNodeGroup, GpuNodeGroupArgs
from components.model_cache import ModelCache, ModelCacheArgs
from components.model_service import ModelService, ModelServiceArgs, serving_mode_from_manifest
from components.naming import dns_label
from components.observability import Observability, ObservabilityArgs
from stacks.config import ModelConfig, ModelVersionConfig, RegionStackConfig

__all__ = ["DEFAULT_TOOLS_IMAGE", "Endpoints", "RegionPlatform", "RegionPlatformArgs"]

# The FSx CSI driver's image carries the Lustre client (``lfs``) that materialize jobs run.
DEFAULT_TOOLS_IMAGE = "public.ecr.aws/fsx-csi-driver/aws-fsx-csi-driver:v1.4.0"

Endpoints = dict[str, dict[str, dict[str, pulumi.Output[Any]]]]


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


@dataclass(frozen=True)
class _Cluster:
    name: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    certificate_authority: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    oidc_issuer: pulumi.Output[str]
    oidc_provider_arn: pulumi.Output[str]


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
        cluster = self._create_cluster() if config.cluster.mode == "create" else self._adopt()
        node_sg = self._node_security_group(cluster)
        provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=_kubeconfig(cluster, config.region),
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
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for group in config.node_groups
        ]
        needs_plugin = any(group.needs_device_plugin for group in groups)
        addons = ClusterAddons(
            f"{name}-addons",
            ClusterAddonsArgs(
                device_plugin_node_selector=(
                    {"llm-serving/ami-family": "al2023"} if needs_plugin else None
                ),
                gateway_namespace=config.namespace,
            ),
            opts=pulumi.ResourceOptions.merge(
                on_cluster, pulumi.ResourceOptions(depends_on=[namespace])
            ),
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
            opts=pulumi.ResourceOptions.merge(
                on_cluster, pulumi.ResourceOptions(depends_on=[namespace, addons])
            ),
        )
        image = pulumi.Output.concat(args.image_repository_url, ":", config.image.tag)
        self.endpoints = {}
        for model, version in served:
            service = self._model_service(
                model,
                version,
                args,
                cache,
                cluster,
                image,
                [namespace, addons, *groups],
                on_cluster,
            )
            self.endpoints.setdefault(model.id, {})[version.version] = {
                "grpc": service.grpc_endpoint,
                "openai": service.openai_endpoint,
                "metrics": service.metrics_endpoint,
            }
        if args.dashboard is not None and args.alert_groups is not None:
            Observability(
                f"{name}-observability",
                ObservabilityArgs(
                    namespace=config.namespace,
                    dashboard=args.dashboard,
                    alert_groups=args.alert_groups,
                ),
                opts=pulumi.ResourceOptions.merge(
                    on_cluster, pulumi.ResourceOptions(depends_on=[namespace, addons])
                ),
            )
        self.cluster_name = cluster.name
        self.register_outputs({"cluster_name": self.cluster_name, "endpoints": self.endpoints})

    def _model_service(
        self,
        model: ModelConfig,
        version: ModelVersionConfig,
        args: RegionPlatformArgs,
        cache: ModelCache,
        cluster: _Cluster,
        image: pulumi.Output[str],
        after: list[pulumi.Resource],
        opts: pulumi.ResourceOptions,
    ) -> ModelService:
        manifest = aws.s3.get_object_output(
            bucket=args.bucket_name,
            key=f"models/{model.id}/{version.version}/manifest.json",
            opts=pulumi.InvokeOutputOptions(parent=self),
        )
        # Red-Black keeps one Service per model across versions; Versioned one per version.
        service_name = dns_label(model.id) if model.strategy == "red-black" else None
        replicas = version.replicas if version.replicas is not None else model.replicas
        return ModelService(
            f"{self._name}-{dns_label(model.id, version.version)}",
            ModelServiceArgs(
                model_id=model.id,
                version=version.version,
                namespace=args.config.namespace,
                image=image,
                serving_mode=manifest.body.apply(serving_mode_from_manifest),
                bucket_name=args.bucket_name,
                oidc_provider_arn=cluster.oidc_provider_arn,
                oidc_issuer=cluster.oidc_issuer,
                cache_claim_name=cache.claim_name,
                node_group=f"{self._name}-{model.node_group}",
                gpus=model.gpus,
                cpu=model.cpu,
                memory_gib=model.memory_gib,
                shm_gib=model.shm_gib,
                replicas=replicas,
                max_replicas=model.max_replicas,
                queue_target=model.queue_target,
                service_name=service_name,
                depends_on=[cache.materialize_jobs[(model.id, version.version)], *after],
            ),
            opts=opts,
        )

    def _create_cluster(self) -> _Cluster:
        config = self._config
        role = aws.iam.Role(
            f"{self._name}-cluster-role",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "eks.amazonaws.com"},
                            "Action": ["sts:AssumeRole", "sts:TagSession"],
                        }
                    ],
                }
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        attachment = aws.iam.RolePolicyAttachment(
            f"{self._name}-cluster-policy",
            role=role.name,
            policy_arn="arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",
            opts=pulumi.ResourceOptions(parent=role),
        )
        cluster = aws.eks.Cluster(
            f"{self._name}-cluster",
            name=config.cluster.name,
            version=config.cluster.version,
            role_arn=role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=config.network.private_subnet_ids,
                endpoint_private_access=True,
                endpoint_public_access=True,
            ),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API", bootstrap_cluster_creator_admin_permissions=True
            ),
            enabled_cluster_log_types=["api", "audit", "authenticator"],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[attachment]),
        )
        issuer_url = cluster.identities.apply(lambda ids: ids[0].oidcs[0].issuer)
        provider = aws.iam.OpenIdConnectProvider(
            f"{self._name}-oidc",
            url=issuer_url,
            client_id_lists=["sts.amazonaws.com"],
            opts=pulumi.ResourceOptions(parent=cluster),
        )
        return _Cluster(
            name=cluster.name,
            endpoint=cluster.endpoint,
            certificate_authority=cluster.certificate_authority.apply(lambda ca: ca.data),
            security_group_id=cluster.vpc_config.apply(lambda v: v.cluster_security_group_id),
            oidc_issuer=issuer_url.apply(_strip_scheme),
            oidc_provider_arn=provider.arn,
        )

    def _adopt(self) -> _Cluster:
        config = self._config
        found = aws.eks.get_cluster_output(
            name=config.cluster.name, opts=pulumi.InvokeOutputOptions(parent=self)
        )
        issuer_url = found.identities.apply(lambda ids: ids[0].oidcs[0].issuer)
        provider = aws.iam.get_open_id_connect_provider_output(
            url=issuer_url, opts=pulumi.InvokeOutputOptions(parent=self)
        )
        return _Cluster(
            name=found.name,
            endpoint=found.endpoint,
            certificate_authority=found.certificate_authorities.apply(lambda cas: cas[0].data),
            security_group_id=found.vpc_config.apply(lambda v: v.cluster_security_group_id),
            oidc_issuer=issuer_url.apply(_strip_scheme),
            oidc_provider_arn=provider.arn,
        )

    def _node_security_group(self, cluster: _Cluster) -> pulumi.Input[str]:
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


def _strip_scheme(url: str) -> str:
    return url.removeprefix("https://")


def _kubeconfig(cluster: _Cluster, region: str) -> pulumi.Output[str]:
    return pulumi.Output.all(cluster.name, cluster.endpoint, cluster.certificate_authority).apply(
        lambda values: json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": values[0],
                        "cluster": {
                            "server": values[1],
                            "certificate-authority-data": values[2],
                        },
                    }
                ],
                "contexts": [{"name": values[0], "context": {"cluster": values[0], "user": "aws"}}],
                "current-context": values[0],
                "users": [
                    {
                        "name": "aws",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1beta1",
                                "command": "aws",
                                "args": [
                                    "eks",
                                    "get-token",
                                    "--cluster-name",
                                    values[0],
                                    "--region",
                                    region,
                                ],
                            }
                        },
                    }
                ],
            }
        )
    )
