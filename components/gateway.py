"""The shared Gateway that model routes attach to, the Gateway API names the routes use, and how
long the Gateway lets one request through a model's routes run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from contracts.deadlines import FRONTEND_REQUEST_TIMEOUT_S

__all__ = [
    "ENVOY_GATEWAY_API",
    "GATEWAY_API",
    "GATEWAY_PLUGIN",
    "GRPC_SUBDOMAIN",
    "GatewayRef",
    "RouteHosts",
    "RouteTimeouts",
    "create_grpc_route_timeout",
    "gateway_duration",
    "route_hosts",
]

GATEWAY_API = "gateway.networking.k8s.io/v1"
GATEWAY_PLUGIN = "argoproj-labs/gatewayAPI"
"""Argo Rollouts' traffic-router plugin for Gateway API routes."""
GRPC_SUBDOMAIN = "grpc"
"""gRPC hostnames live under ``grpc.<domain>``, OpenAI HTTP hostnames directly under the domain."""
ENVOY_GATEWAY_API = "gateway.envoyproxy.io/v1alpha1"
"""Envoy Gateway's policy API (its chart installs the CRDs with the Gateway API's)."""
_MAX_DURATION_S = 99999 * 3600
"""The longest Gateway API duration (GEP-2257: at most 5 digits per unit)."""


@dataclass(frozen=True)
class RouteHosts:
    """The two hostnames of one served model (version): a listener accepts only one of a
    GRPCRoute and an HTTPRoute that claim the same hostname, so they never share one."""

    grpc: str
    """Hostname of the GRPCRoute (KServe v2 gRPC)."""
    http: str
    """Hostname of the HTTPRoute (the OpenAI-compatible API)."""


def route_hosts(labels: Sequence[str], domain: str) -> RouteHosts:
    """``<labels>.grpc.<domain>`` for gRPC and ``<labels>.<domain>`` for the OpenAI HTTP API."""
    prefix = ".".join(labels)
    return RouteHosts(grpc=f"{prefix}.{GRPC_SUBDOMAIN}.{domain}", http=f"{prefix}.{domain}")


@dataclass(frozen=True)
class GatewayRef:
    """The Gateway whose listeners the model's routes attach to."""

    name: str
    """Gateway name."""
    namespace: str | None = None
    """Gateway namespace (the routes' namespace when ``None``)."""
    grpc_section: str | None = None
    """Listener for gRPC (KServe v2), ``None`` for any listener."""
    http_section: str | None = None
    """Listener for the OpenAI HTTP API, ``None`` for any listener."""
    port: int = 443
    """Port clients reach the listeners on."""
    tls: bool = True
    """Whether the listeners terminate TLS (``https``) or serve plain HTTP and h2c."""

    def grpc_address(self, host: str) -> str:
        """Where gRPC clients connect for ``host``."""
        return f"{host}:{self.port}"

    def http_url(self, host: str, path: str = "") -> str:
        """The URL of ``path`` on ``host`` through this Gateway."""
        scheme, default = ("https", 443) if self.tls else ("http", 80)
        netloc = host if self.port == default else f"{host}:{self.port}"
        return f"{scheme}://{netloc}{path}"

    def parent_ref(self, section: str | None) -> dict[str, Any]:
        """A route's ``parentRefs`` entry for this Gateway's listener ``section``."""
        ref: dict[str, Any] = {"name": self.name}
        if self.namespace is not None:
            ref["namespace"] = self.namespace
        if section is not None:
            ref["sectionName"] = section
        return ref


def gateway_duration(seconds: float) -> str:
    """``seconds`` as a Gateway API duration (GEP-2257, as Envoy Gateway's policies take them
    too), rounded up to the millisecond: ``630.0`` is ``10m30s``, ``0.25`` is ``250ms``."""
    if not 0 <= seconds <= _MAX_DURATION_S:
        raise ValueError(f"{seconds} s is no Gateway API duration; expected 0..{_MAX_DURATION_S} s")
    millis = math.ceil(round(seconds * 1000, 6))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    whole, millis = divmod(millis, 1000)
    parts = [(hours, "h"), (minutes, "m"), (whole, "s"), (millis, "ms")]
    return "".join(f"{value}{unit}" for value, unit in parts if value) or "0s"


@dataclass(frozen=True)
class RouteTimeouts:
    """How long the Gateway lets one request through a model's routes run: just above the
    serving pod's own deadline, so that the pod's deadline error (a 504 with the OpenAI error
    body, or a last SSE event) reaches the client rather than the Gateway's cut.

    Without it Envoy Gateway (v1.4.0) leaves a route at Envoy's defaults: a 15 s route timeout
    from the end of the request to the end of the response, streamed or not, and a 5-minute
    stream idle timeout. A bound set here also lifts the route's idle timeout to an hour (at
    least the bound). Envoy starts the bound when the request ends: a ``ModelStreamInfer`` stream
    that its client keeps open is bounded from its half-close on, and by the idle timeout
    before.
    """

    backend_deadline_s: float = FRONTEND_REQUEST_TIMEOUT_S
    """The serving pod's per-request deadline (``LLM_SERVING_FRONTEND_REQUEST_TIMEOUT_S``)."""
    margin_s: float = 30.0
    """How much longer the Gateway waits than the pod: time to read the request and to send the
    pod's own deadline error."""

    def __post_init__(self) -> None:
        for name in ("backend_deadline_s", "margin_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} is {getattr(self, name)}; expected seconds above 0")
        gateway_duration(self.backend_deadline_s + self.margin_s)

    @property
    def request(self) -> str:
        """The Gateway's bound on one request, as a Gateway API duration."""
        return gateway_duration(self.backend_deadline_s + self.margin_s)

    def http_rule(self) -> dict[str, str]:
        """An HTTPRoute rule's ``timeouts``: ``request`` only. Envoy Gateway would make a
        ``backendRequest`` the route timeout in its place (and a retry's per-try timeout, but
        these routes retry nothing)."""
        return {"request": self.request}

    def grpc_policy(self, route_name: pulumi.Input[str]) -> dict[str, Any]:
        """The spec of the BackendTrafficPolicy that bounds a GRPCRoute, whose Gateway API
        type has no ``timeouts``."""
        return {
            "targetRefs": [
                {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute", "name": route_name}
            ],
            "timeout": {"http": {"requestTimeout": self.request}},
        }


def create_grpc_route_timeout(
    name: str,
    route: k8s.apiextensions.CustomResource,
    timeouts: RouteTimeouts,
    metadata: Mapping[str, Any],
    opts: pulumi.ResourceOptions,
) -> k8s.apiextensions.CustomResource:
    """The BackendTrafficPolicy that bounds ``route`` (a GRPCRoute) by ``timeouts``; its
    ``metadata`` must place it in the route's namespace."""
    return k8s.apiextensions.CustomResource(
        name,
        api_version=ENVOY_GATEWAY_API,
        kind="BackendTrafficPolicy",
        metadata=dict(metadata),
        spec=timeouts.grpc_policy(route.metadata["name"]),
        opts=opts,
    )
