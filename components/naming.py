"""Kubernetes object names built from model ids and versions (DNS-1123 labels)."""

from __future__ import annotations

import hashlib
import re

__all__ = ["dns_label"]

_INVALID = re.compile(r"[^a-z0-9-]+")


def dns_label(*parts: str, limit: int = 63) -> str:
    """Join ``parts`` into a DNS-1123 label; an over-long name keeps a hash of the whole."""
    name = _INVALID.sub("-", "-".join(parts).lower()).strip("-")
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"
