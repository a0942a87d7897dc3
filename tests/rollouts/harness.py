"""Declaring RedBlackRollout under the recording mocks, with realistic arguments."""

from __future__ import annotations

from typing import Any

import pulumi

from components.gateway import GatewayRef
from components.red_black import RedBlackArgs, RedBlackRollout
from tests.rollouts.mocks import RecordingMocks
from tests.rollouts.samples import pod_template, queries, success_conditions


def make_args(**overrides: Any) -> RedBlackArgs:
    values: dict[str, Any] = {
        "model_id": "llama",
        "version": "2026-11-15",
        "pod_template": pod_template(),
        "namespace": "serving",
        "gateway": GatewayRef(name="inference", namespace="gateway", grpc_section="grpc"),
        "queries": queries(),
        "success_conditions": success_conditions(),
        "prometheus_address": "http://prometheus.monitoring:9090",
        "replicas": 4,
        "hostnames": ("llama.models.example.com",),
        "grpc_hostnames": ("llama.grpc.models.example.com",),
    }
    values.update(overrides)
    return RedBlackArgs(**values)


def deploy(mocks: RecordingMocks, args: RedBlackArgs) -> list[str]:
    """Declare the component under the mocks; returns the name of its status Job once every
    resource (the Job last: it waits for the Rollout) has been registered."""
    pulumi.runtime.set_mocks(mocks, preview=False)
    names: list[str] = []

    @pulumi.runtime.test
    def declare() -> pulumi.Output:
        return RedBlackRollout("llama", args).status_job_name.apply(names.append)

    declare()
    return names


def run_under_mocks(mocks: RecordingMocks, build: Any) -> list[Any]:
    """Run ``build()`` (returning an Output) under the mocks; returns the Output's value."""
    pulumi.runtime.set_mocks(mocks, preview=False)
    values: list[Any] = []

    @pulumi.runtime.test
    def declare() -> pulumi.Output:
        return build().apply(values.append)

    declare()
    return values
