"""What a plugin requires, the extras it asks for followed: ``foo[bar]`` also requires what
foo's extra ``bar`` adds, read from foo's own metadata, to any depth.

pip installs plugins with ``--no-deps``, so packaging and stage 3 check these themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

__all__ = ["Required", "RequiresOf", "through_extras"]

RequiresOf = Callable[[str], Iterable[str] | None]
"""The ``Requires-Dist`` lines of the distribution a canonical name resolves to, or None."""


@dataclass(frozen=True)
class Required:
    """One requirement that holds, and who asks for it."""

    who: str
    """``plugin x``, or ``plugin x requires 'foo[bar]', and foo[bar]`` for what an extra adds."""
    requirement: Requirement


def _parsed(texts: Iterable[str], owner: str) -> list[Requirement]:
    try:
        return [Requirement(text) for text in texts]
    except InvalidRequirement as exc:
        raise ValueError(f"{owner} declares a requirement that cannot be parsed: {exc}") from exc


def through_extras(
    owner: str,
    requires: Iterable[str],
    requires_of: RequiresOf,
    markers: Mapping[str, str] | None = None,
) -> Iterator[Required]:
    """``owner``'s requirements whose markers hold (for ``markers``, else this interpreter), then
    what each extra they ask for adds, breadth first; an extra is followed once.

    Raises ValueError for a requirement line that cannot be parsed.
    """
    base = dict(markers or {})

    def holds(marker: Marker | None, extra: str) -> bool:
        return marker is None or marker.evaluate(base | {"extra": extra})

    pending = [Required(owner, r) for r in _parsed(requires, owner) if holds(r.marker, "")]
    followed: dict[str, set[str]] = {}
    while pending:
        item = pending.pop(0)
        yield item
        req = item.requirement
        name = canonicalize_name(req.name)
        extras = sorted({canonicalize_name(e) for e in req.extras} - followed.get(name, set()))
        lines = requires_of(name) if extras else None
        if lines is None:
            continue
        followed.setdefault(name, set()).update(extras)
        via = f"{item.who} requires {str(req)!r}, and {name}[{','.join(extras)}]"
        # Only what the extras add: the distribution's own requirements are the image's, or
        # checked as that wheel's when the package ships it.
        pending += [
            Required(via, r)
            for r in _parsed(lines, f"{name}[{','.join(extras)}]")
            if not holds(r.marker, "") and any(holds(r.marker, e) for e in extras)
        ]
