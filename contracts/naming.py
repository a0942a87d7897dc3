"""Names built from model ids and versions (DNS-1123 labels), and bounded physical names."""

from __future__ import annotations

import hashlib
import re

__all__ = [
    "AWS_AUTONAME_SUFFIX",
    "KUBERNETES_AUTONAME_SUFFIX",
    "dns_label",
    "kubernetes_name",
    "physical_name",
    "route_label",
]

_INVALID = re.compile(r"[^a-z0-9-]+")
# pulumi-aws auto-names "<resource name>-" plus 7 random characters; pulumi-kubernetes plus 8.
AWS_AUTONAME_SUFFIX = 8
KUBERNETES_AUTONAME_SUFFIX = 9


def dns_label(*parts: str, limit: int = 63) -> str:
    """Join ``parts`` into a DNS-1123 label; an over-long name keeps a hash of the whole."""
    name = _INVALID.sub("-", "-".join(parts).lower()).strip("-")
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def route_label(value: str) -> str:
    """``value`` lower-cased, each character outside ``a-z0-9-`` as its own ``-`` (runs kept,
    unlike :func:`dns_label`): how a Versioned model labels a version's routes and hostname."""
    return re.sub(r"[^a-z0-9-]", "-", value.lower()).strip("-")


def physical_name(resource_name: str, limit: int, suffix: int = AWS_AUTONAME_SUFFIX) -> str | None:
    """``None`` where the provider's auto-name of ``resource_name`` fits ``limit``, else the
    resource name bounded to ``limit`` with :func:`dns_label`.

    Names that fit keep auto-naming because changing a physical name replaces the resource.
    """
    if len(resource_name) + suffix <= limit:
        return None
    return dns_label(resource_name, limit=limit)


def kubernetes_name(resource_name: str, limit: int = 63) -> dict[str, str]:
    """``{"name": ...}`` for an object's metadata where pulumi-kubernetes' auto-name of
    ``resource_name`` would exceed ``limit``, else ``{}`` (auto-named)."""
    name = physical_name(resource_name, limit, KUBERNETES_AUTONAME_SUFFIX)
    return {} if name is None else {"name": name}
