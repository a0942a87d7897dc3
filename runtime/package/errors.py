"""The one exception type of model packaging, publishing and unpacking."""

from __future__ import annotations

__all__ = ["PackageError"]


class PackageError(ValueError):
    """A package, its source tree or its archive is refused; the message names file and fix."""
