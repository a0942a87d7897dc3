"""Every model route of every shipped region stack lets a request run just past the serving pod's
own deadline (the OpenAI frontend's ``LLM_SERVING_FRONTEND_REQUEST_TIMEOUT_S``), so the pod's
deadline error reaches the client, and no Envoy default cuts a long generation first.

Envoy Gateway v1.4.0 (the pinned chart) leaves a route without ``timeouts`` (and without a
BackendTrafficPolicy) at Envoy's own defaults: a 15 s route timeout from the end of the request
to the end of the response, streamed or not, and a 5-minute stream idle timeout. The Gateway
API gives a GRPCRoute no ``timeouts``, so its bound is a BackendTrafficPolicy's
``timeout.http.requestTimeout``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from runtime.frontend.settings import FrontendSettings
from stacks.kubernetes_objects import kubernetes_objects
from stacks.plan import format_tree
from tests.support.stack_plans import REGION_STACKS, stack_plan

FRONTEND_DEADLINE_S = FrontendSettings.model_fields["request_timeout_s"].default
ENVOY_ROUTE_TIMEOUT_S = 15.0
"""Envoy's default ``RouteAction.timeout``, which Envoy Gateway v1.4.0 keeps for a route that
sets none (``internal/xds/translator/route.go``: ``Timeout`` only from the route or a policy)."""
MARGIN_LIMIT_S = 60.0
"""How far above the pod's deadline the Gateway's bound may sit and still be "just above"."""
_PART = re.compile(r"([0-9]{1,5})(h|ms|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}

Manifest = dict[str, Any]


def seconds(duration: str) -> float:
    """A Gateway API duration (GEP-2257: ``1h``, ``10m30s``, ``500ms``) in seconds."""
    assert re.fullmatch(r"([0-9]{1,5}(h|m|s|ms)){1,4}", duration), duration
    return sum(int(n) * _UNIT_S[unit] for n, unit in _PART.findall(duration))


def _key(manifest: Manifest) -> tuple[str, str, str]:
    metadata = manifest["metadata"]
    return manifest["kind"], metadata.get("namespace", ""), metadata["name"]


def _bounded(value: str | None, where: str) -> None:
    assert value is not None, f"{where}: no timeout; Envoy's {ENVOY_ROUTE_TIMEOUT_S:g} s applies"
    assert FRONTEND_DEADLINE_S < seconds(value) <= FRONTEND_DEADLINE_S + MARGIN_LIMIT_S, (
        f"{where}: {value} is not just above the frontend's {FRONTEND_DEADLINE_S:g} s deadline"
    )


def test_the_frontend_deadline_outlasts_envoys_default_route_timeout() -> None:
    # What makes a route without a bound a defect: the pod would answer after Envoy gave up.
    assert FRONTEND_DEADLINE_S > ENVOY_ROUTE_TIMEOUT_S


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_every_model_route_outlasts_the_frontend_deadline(stack: str) -> None:
    manifests = [m for _, m in kubernetes_objects(stack_plan(stack))]
    routes = [m for m in manifests if m["kind"] in ("GRPCRoute", "HTTPRoute")]
    assert {m["kind"] for m in routes} == {"GRPCRoute", "HTTPRoute"}
    policies: dict[tuple[str, str, str], list[Manifest]] = {}
    for policy in (m for m in manifests if m["kind"] == "BackendTrafficPolicy"):
        namespace = policy["metadata"].get("namespace", "")
        for ref in policy["spec"]["targetRefs"]:
            assert ref["group"] == "gateway.networking.k8s.io"
            policies.setdefault((ref["kind"], namespace, ref["name"]), []).append(policy)
    for route in routes:
        where = "{} {}/{}".format(*_key(route))
        if route["kind"] == "HTTPRoute":
            assert _key(route) not in policies, f"{where}: bounded twice"
            for index, rule in enumerate(route["spec"]["rules"]):
                _bounded((rule.get("timeouts") or {}).get("request"), f"{where} rule {index}")
        else:
            found = policies.get(_key(route), [])
            assert len(found) == 1, f"{where}: {len(found)} BackendTrafficPolicies target it"
            timeout = found[0]["spec"].get("timeout", {}).get("http", {}).get("requestTimeout")
            _bounded(timeout, where)
    # No policy targets what the plan does not hold.
    assert set(policies) <= {_key(route) for route in routes}


def test_seconds_reads_gateway_api_durations() -> None:
    assert seconds("10m30s") == 630.0
    assert seconds("1h500ms") == 3600.5
    assert seconds("15s") == ENVOY_ROUTE_TIMEOUT_S


def test_the_plan_tree_shows_each_routes_bound() -> None:
    # Reviewers read the tree: a changed bound must show there, not only in plan-out/ YAML.
    tree = format_tree(stack_plan("prod-us-east-1"))
    policies = [i for i, line in enumerate(tree) if ":BackendTrafficPolicy " in line]
    routes = [i for i, line in enumerate(tree) if ":HTTPRoute " in line]
    assert policies and routes
    for start in policies:
        assert "spec.timeout.http.requestTimeout: 10m30s" in [s.strip() for s in tree[start:][:4]]
    for start in routes:
        assert 'spec.rules[].timeouts.request: ["10m30s"]' in [s.strip() for s in tree[start:][:4]]
