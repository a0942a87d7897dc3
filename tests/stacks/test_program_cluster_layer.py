"""The cluster layer of every shipped region stack: the EBS CSI add-on under Prometheus's volume
(created clusters), the public endpoint's ranges, and KEDA scaling without any Secret."""

from __future__ import annotations

import pytest

from stacks.mock_engine import ProgramRun, RecordedResource
from tests.support.stack_plans import REGION_STACKS, region_config, stack_plan

RELEASE = "kubernetes:helm.sh/v3:Release"
ADDON = "aws:eks/addon:Addon"
SCALED_OBJECT = "kubernetes:keda.sh/v1alpha1:ScaledObject"


def _release(run: ProgramRun, name: str) -> RecordedResource:
    (release,) = [r for r in run.resources if r.type == RELEASE and r.inputs["name"] == name]
    return release


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_prometheus_claims_the_configured_volume_after_its_driver(stack: str) -> None:
    config, run = region_config(stack), stack_plan(stack)
    prometheus = _release(run, "kube-prometheus-stack")
    spec = prometheus.inputs["values"]["prometheus"]["prometheusSpec"]
    claim = spec["storageSpec"]["volumeClaimTemplate"]["spec"]
    gib = config.observability.prometheus_storage_gib
    assert claim["resources"]["requests"]["storage"] == f"{gib}Gi"
    addons = [r for r in run.resources if r.type == ADDON]
    if config.cluster.mode == "adopt":
        # The cluster's owners run its storage drivers, as they run its system nodes.
        assert addons == []
        return
    (addon,) = addons
    assert addon.inputs["addonName"] == "aws-ebs-csi-driver"
    assert addon.urn in prometheus.dependencies


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_the_public_endpoint_admits_what_the_stack_file_lists(stack: str) -> None:
    config, run = region_config(stack), stack_plan(stack)
    clusters = [r for r in run.resources if r.type == "aws:eks/cluster:Cluster"]
    if config.cluster.mode == "adopt":
        assert clusters == []
        return
    (cluster,) = clusters
    assert cluster.inputs["vpcConfig"]["publicAccessCidrs"] == config.cluster.public_access_cidrs


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_keda_scales_every_model_without_reading_a_secret(stack: str) -> None:
    run = stack_plan(stack)
    keda = _release(run, "keda").inputs["values"]
    assert keda["permissions"]["operator"]["restrict"]["secret"] is True
    # Restricted, the operator reads Secrets of its own namespace only: a TriggerAuthentication
    # or a *FromEnv parameter taken from a model pod's Secret-backed env would resolve to nothing.
    triggers = [
        trigger
        for r in run.resources
        if r.type == SCALED_OBJECT
        for trigger in r.inputs["spec"]["triggers"]
    ]
    assert triggers
    for trigger in triggers:
        assert trigger["type"] == "prometheus"
        assert "authenticationRef" not in trigger
        assert not [k for k in trigger["metadata"] if k.endswith("FromEnv") or k == "authModes"]
