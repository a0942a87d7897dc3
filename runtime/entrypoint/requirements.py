"""Stage 3's check that a plugin finds what it requires, the extras it asks for included, among
the package's wheels and the image's distributions, before anything is installed.

pip installs the plugins with ``--no-deps`` (its resolver would re-check the whole image), so
this check is the only one their requirements get in the image.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from runtime.package.requirements import through_extras

__all__ = ["Available", "unmet_requirement"]


@dataclass(frozen=True)
class Available:
    """A distribution a plugin can use: shipped by the package or installed in the image."""

    version: str
    requires: tuple[str, ...]
    """Its ``Requires-Dist`` lines, markers not yet evaluated."""


def unmet_requirement(
    plugin: str, requires: Iterable[str], lookup: Callable[[str], Available | None]
) -> str | None:
    """Why plugin ``plugin`` (its ``Requires-Dist`` lines) would miss something it requires, or
    None; ``lookup`` gives what a canonical name resolves to. Markers are this interpreter's.

    Raises ValueError for a requirement line that cannot be parsed.
    """

    def requires_of(name: str) -> tuple[str, ...] | None:
        have = lookup(name)
        return None if have is None else have.requires

    for item in through_extras(f"plugin {plugin}", requires, requires_of):
        req = item.requirement
        have = lookup(canonicalize_name(req.name))
        # An installed pre-release counts, as for pip (NVIDIA's torch is 2.13.0a0+...).
        if have is None or not req.specifier.contains(have.version, prereleases=True):
            state = "is not installed" if have is None else f"is {have.version}"
            return f"{item.who} requires {str(req)!r} but {req.name} {state}"
    return None
