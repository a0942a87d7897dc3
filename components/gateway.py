"""The shared Gateway that model routes attach to, and the Gateway API names the routes use."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GATEWAY_API",
    "GATEWAY_PLUGIN",
    "GRPC_SUBDOMAIN",
    "GatewayRef",
    "RouteHosts",
    "route_hosts",
]

GATEWAY_API = "gateway.networking.k8s.io/v1"
GATEWAY_PLUGIN = "argoproj-labs/gatewayAPI"
"""Argo Rollouts' traffic-router plugin for Gateway API routes."""
GRPC_SUBDOMAIN = "grpc"
"""gRPC hostnames live under ``grpc.<domain>``, OpenAI HTTP hostnames directly under the domain."""


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
