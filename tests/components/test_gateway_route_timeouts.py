"""The Gateway's bound on a model's routes (``components.gateway.RouteTimeouts``): just above the
serving pod's own deadline, on the HTTPRoute's rules (``timeouts.request``) and, since the Gateway
API's GRPCRoute has no ``timeouts``, in an Envoy Gateway BackendTrafficPolicy on the GRPCRoute;
for Red-Black and Versioned alike, each new object valid against its pinned CRD (schema and CEL).
"""

from __future__ import annotations

from typing import Any

import pytest

from components.gateway import GatewayRef, RouteTimeouts, gateway_duration
from components.red_black import RedBlackRollout
from components.versioned import VersionedArgs, VersionedModel, VersionSpec
from contracts.deadlines import FRONTEND_REQUEST_TIMEOUT_S
from runtime.frontend.settings import FrontendSettings
from stacks.kubernetes_objects import kubernetes_objects
from tests.components.declared import Declare, Declared
from tests.rollouts.harness import make_args
from tests.rollouts.samples import pod_template
from tests.stacks.test_plan_custom_resources import _errors
from tests.stacks.test_plan_custom_resources_cel import _validate

GRPC_ROUTE = "kubernetes:gateway.networking.k8s.io/v1:GRPCRoute"
HTTP_ROUTE = "kubernetes:gateway.networking.k8s.io/v1:HTTPRoute"
POLICY = "kubernetes:gateway.envoyproxy.io/v1alpha1:BackendTrafficPolicy"


def test_the_default_bound_follows_the_frontends_own_deadline() -> None:
    assert FrontendSettings.model_fields["request_timeout_s"].default == FRONTEND_REQUEST_TIMEOUT_S
    timeouts = RouteTimeouts()
    assert timeouts.backend_deadline_s == FRONTEND_REQUEST_TIMEOUT_S
    assert timeouts.request == "10m30s"
    assert RouteTimeouts(backend_deadline_s=1800, margin_s=15).request == "30m15s"


@pytest.mark.parametrize(
    ("seconds", "duration"),
    [
        (0, "0s"),
        (0.25, "250ms"),
        (15, "15s"),
        (630, "10m30s"),
        (3600.5, "1h500ms"),
        (90061.001, "25h1m1s1ms"),
        (0.0001, "1ms"),  # rounded up: a bound never below what was asked
    ],
)
def test_durations_are_gateway_api_durations(seconds: float, duration: str) -> None:
    assert gateway_duration(seconds) == duration


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend_deadline_s": 0}, "backend_deadline_s is 0; expected seconds above 0"),
        ({"margin_s": -1}, "margin_s is -1; expected seconds above 0"),
        ({"backend_deadline_s": 10**9}, "is no Gateway API duration"),
    ],
)
def test_a_bound_that_cannot_be_written_is_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RouteTimeouts(**fields)


def _bounds(declared: Declared, request: str) -> list[dict[str, Any]]:
    """Checks that every route of the run is bounded by ``request``, each GRPCRoute by exactly
    one policy of its own namespace and component; returns the policies' manifests."""
    manifests = {r.urn: m for r, m in kubernetes_objects(declared.run)}
    routes = declared.of_type(GRPC_ROUTE) + declared.of_type(HTTP_ROUTE)
    policies = declared.of_type(POLICY)
    assert routes and len(policies) == len(declared.of_type(GRPC_ROUTE))
    for route in routes:
        manifest = manifests[route.urn]
        if route.type == HTTP_ROUTE:
            assert [r["timeouts"] for r in manifest["spec"]["rules"]] == [{"request": request}]
            continue
        (policy,) = [
            p
            for p in policies
            if p.inputs["spec"]["targetRefs"][0]["name"] == manifest["metadata"]["name"]
        ]
        assert policy.parent == route.parent  # a child of the same component
        assert policy.inputs["metadata"] == route.inputs["metadata"]  # namespace and labels
        assert policy.inputs["spec"] == {
            "targetRefs": [
                {
                    "group": "gateway.networking.k8s.io",
                    "kind": "GRPCRoute",
                    "name": manifest["metadata"]["name"],
                }
            ],
            "timeout": {"http": {"requestTimeout": request}},
        }
    return [manifests[p.urn] for p in policies]


def _valid(declared: Declared) -> None:
    """Every route and policy passes its pinned CRD's schema and CEL rules."""
    for resource, manifest in kubernetes_objects(declared.run):
        if resource.type in (GRPC_ROUTE, HTTP_ROUTE, POLICY):
            assert _errors(manifest) == []
            assert _validate(manifest).violations == []


def test_red_black_bounds_both_routes(declare: Declare) -> None:
    declared = declare(lambda: RedBlackRollout("llama", make_args()))
    (policy,) = _bounds(declared, "10m30s")
    assert policy["metadata"]["namespace"] == "serving"
    _valid(declared)


def test_red_black_takes_the_bound_it_is_given(declare: Declare) -> None:
    timeouts = RouteTimeouts(backend_deadline_s=1200, margin_s=20)
    declared = declare(lambda: RedBlackRollout("llama", make_args(timeouts=timeouts)))
    _bounds(declared, "20m20s")


def _versioned(timeouts: RouteTimeouts | None = None) -> None:
    VersionedModel(
        "ranker",
        VersionedArgs(
            model_id="ranker",
            versions=(
                VersionSpec("v3", pod_template=pod_template("ranker", "v3"), route_weight=10),
                VersionSpec("v4", service_name="ranker-v4", route_weight=90),
            ),
            namespace="serving",
            gateway=GatewayRef(name="inference", namespace="gateway"),
            domain="models.example.com",
            timeouts=RouteTimeouts() if timeouts is None else timeouts,
        ),
    )


def test_versioned_bounds_every_route_of_every_version_and_the_shared_ones(
    declare: Declare,
) -> None:
    declared = declare(_versioned)
    policies = _bounds(declared, "10m30s")
    assert sorted(p["metadata"]["labels"]["llm-serving/model-version"] for p in policies) == [
        "shared",
        "v3",
        "v4",
    ]
    _valid(declared)
    faster = declare(lambda: _versioned(RouteTimeouts(backend_deadline_s=60, margin_s=0.5)))
    _bounds(faster, "1m500ms")
