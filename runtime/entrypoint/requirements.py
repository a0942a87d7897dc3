"""Stage 3's check that a plugin finds what it requires, the extras it asks for included, among
the package's wheels and the image's distributions, before anything is installed.

pip installs the plugins with ``--no-deps`` (its resolver would re-check the whole image), so
this check is the only one their requirements get.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

__all__ = ["Available", "unmet_requirement"]


@dataclass(frozen=True)
class Available:
    """A distribution a plugin can use: shipped by the package or installed in the image."""

    version: str
    requires: tuple[str, ...]
    """Its ``Requires-Dist`` lines, markers not yet evaluated."""


Lookup = Callable[[str], Available | None]
"""The distribution a canonical name resolves to, or None."""


def _holds(marker: Marker | None, extra: str) -> bool:
    # Markers as for this interpreter, which is the one the plugins run in.
    return marker is None or marker.evaluate({"extra": extra})


def _parsed(texts: Iterable[str], owner: str) -> list[Requirement]:
    try:
        return [Requirement(text) for text in texts]
    except InvalidRequirement as exc:
        raise ValueError(f"{owner} declares a requirement that cannot be parsed: {exc}") from exc


def unmet_requirement(plugin: str, requires: Iterable[str], lookup: Lookup) -> str | None:
    """Why plugin ``plugin`` (its ``Requires-Dist`` lines) would miss something it requires, or
    None; ``foo[bar]`` also requires what foo's extra ``bar`` adds, followed to any depth.

    Raises ValueError for a requirement line that cannot be parsed.
    """
    pending = [
        (f"plugin {plugin}", req)
        for req in _parsed(requires, f"plugin {plugin}")
        if _holds(req.marker, "")
    ]
    followed: set[tuple[str, str]] = set()
    while pending:
        who, req = pending.pop(0)
        name = canonicalize_name(req.name)
        have = lookup(name)
        # An installed pre-release counts, as for pip (NVIDIA's torch is 2.13.0a0+...).
        if have is None or not req.specifier.contains(have.version, prereleases=True):
            state = "is not installed" if have is None else f"is {have.version}"
            return f"{who} requires {str(req)!r} but {req.name} {state}"
        done = {e for n, e in followed if n == name}
        extras = sorted({canonicalize_name(e) for e in req.extras} - done)
        if not extras:
            continue
        followed |= {(name, e) for e in extras}
        via = f"{who} requires {str(req)!r}, and {name}[{','.join(extras)}]"
        # Only what the extras add: the distribution's own requirements are the image's (or,
        # for a wheel of the package, checked as that plugin's).
        pending += [
            (via, r)
            for r in _parsed(have.requires, f"{req.name} {have.version}")
            if not _holds(r.marker, "") and any(_holds(r.marker, e) for e in extras)
        ]
    return None
