"""ClusterAddons: Prometheus keeps its samples on a gp3 volume for longer than versions gc's idle
window, and KEDA's operator reads no Secret outside its namespace."""

from __future__ import annotations

import inspect
import re
from datetime import timedelta
from pathlib import Path

import pulumi
import pytest
import yaml

from components.cluster_addons import (
    KEDA,
    PROMETHEUS_RETENTION,
    STORAGE_CLASS,
    ClusterAddons,
    ClusterAddonsArgs,
)
from operations.cli import versions_gc
from operations.versions_gc import COVERAGE_SLACK, parse_idle
from stacks.kubernetes_objects import validate_object
from tests.components.declared import Declare, Declared

RELEASE = "kubernetes:helm.sh/v3:Release"
STORAGE_CLASS_TYPE = "kubernetes:storage.k8s.io/v1:StorageClass"
CHARTS = Path(__file__).resolve().parents[3] / "shared" / "reference" / "charts"


def _addons(declare: Declare, gib: int = 50, driver: bool = False) -> Declared:
    def program() -> None:
        drivers = [pulumi.CustomResource("test:index:Driver", "ebs-csi")] if driver else []
        ClusterAddons(
            "addons",
            ClusterAddonsArgs(
                device_plugin_node_selector=None,
                gateway_namespace="serving",
                prometheus_storage_gib=gib,
                storage_driver=drivers,
            ),
        )

    return declare(program)


def _release(declared: Declared, name: str) -> dict:
    return next(r.inputs for r in declared.of_type(RELEASE) if r.inputs["name"] == name)


def _duration(value: str) -> timedelta:
    return parse_idle(value)[1]


def test_prometheus_keeps_its_samples_on_a_gp3_volume_of_the_ebs_csi_driver(
    declare: Declare,
) -> None:
    declared = _addons(declare, driver=True)
    spec = _release(declared, "kube-prometheus-stack")["values"]["prometheus"]["prometheusSpec"]
    claim = spec["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim == {
        "storageClassName": STORAGE_CLASS,
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "50Gi"}},
    }
    storage_class = declared.one(STORAGE_CLASS_TYPE)
    assert storage_class.inputs["metadata"]["name"] == STORAGE_CLASS
    assert storage_class.inputs["provisioner"] == "ebs.csi.aws.com"
    assert storage_class.inputs["parameters"] == {"type": "gp3", "encrypted": "true"}
    # An EBS volume lives in one zone: created where the Prometheus pod was scheduled.
    assert storage_class.inputs["volumeBindingMode"] == "WaitForFirstConsumer"
    assert storage_class.inputs["allowVolumeExpansion"] is True
    assert validate_object(storage_class.inputs) == (True, None)
    # The release is atomic: its pod must find the class and a driver to provision the claim.
    prometheus = next(
        r for r in declared.of_type(RELEASE) if r.inputs["name"] == "kube-prometheus-stack"
    )
    driver = declared.one("test:index:Driver")
    assert {storage_class.urn, driver.urn} <= set(prometheus.dependencies)


def test_retention_covers_the_versions_gc_idle_window_with_margin(declare: Declare) -> None:
    spec = _release(_addons(declare), "kube-prometheus-stack")["values"]["prometheus"][
        "prometheusSpec"
    ]
    assert spec["retention"] == PROMETHEUS_RETENTION
    default_idle = inspect.signature(versions_gc).parameters["idle"].default
    retention, slack = _duration(PROMETHEUS_RETENTION), _duration(COVERAGE_SLACK)
    assert retention >= _duration(default_idle) + slack
    # The margin: a weekly window (--idle 7d) fits as well.
    assert retention >= _duration("7d") + slack


@pytest.mark.parametrize("gib", [20, 50, 333])
def test_retention_size_stays_below_the_volume(declare: Declare, gib: int) -> None:
    spec = _release(_addons(declare, gib), "kube-prometheus-stack")["values"]["prometheus"][
        "prometheusSpec"
    ]
    assert spec["storageSpec"]["volumeClaimTemplate"]["spec"]["resources"] == {
        "requests": {"storage": f"{gib}Gi"}
    }
    # Prometheus's GB is 2^30 bytes, as Kubernetes's Gi; its docs advise at most 80-85%.
    match = re.fullmatch(r"(\d+)GB", spec["retentionSize"])
    assert match is not None, spec["retentionSize"]
    assert 0.7 * gib <= int(match.group(1)) <= 0.85 * gib


def test_a_volume_below_the_minimum_is_refused(declare: Declare) -> None:
    with pytest.raises(
        ValueError, match="prometheus_storage_gib: 10 GiB is below the minimum of 20"
    ):
        _addons(declare, gib=10)


def test_keda_operator_reads_secrets_of_its_own_namespace_only(declare: Declare) -> None:
    values = _release(_addons(declare), "keda")["values"]
    assert values["permissions"]["operator"]["restrict"]["secret"] is True
    # The key is the pinned chart's own (off by default there): a bump that drops it fails.
    default = yaml.safe_load((CHARTS / f"keda-{KEDA.version}" / "values.yaml").read_text())
    assert default["permissions"]["operator"]["restrict"]["secret"] is False
