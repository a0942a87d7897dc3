"""Which plugin wheels vLLM would never load: no entry point in either of its plugin groups.

A wheel another plugin of the package requires is exempt: the install is offline, so a plugin's
own dependencies travel as wheels too, and they are libraries, not vLLM plugins.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from runtime.package.wheels import PLUGIN_GROUPS

__all__ = ["PluginWheel", "Unloadable", "unloadable"]


@dataclass(frozen=True)
class PluginWheel:
    """One plugin wheel of a package, as far as the entry-point check needs it."""

    wheel: str
    """The wheel's path in the package."""
    distribution: str
    requires: tuple[str, ...]
    """Its ``Requires-Dist`` lines, markers not yet evaluated."""
    groups: frozenset[str]
    """Every entry-point group it declares, vLLM's or not."""


@dataclass(frozen=True)
class Unloadable:
    """A plugin wheel vLLM would never load, what is wrong with it and what to change."""

    plugin: PluginWheel
    problem: str
    """``registers no entry point in ...; its group [x] looks like a misspelling of y``."""
    fix: str
    """``rename [x] to [y]``, or where to declare the entry point."""


def _required(plugin: PluginWheel, markers: Mapping[str, str]) -> set[str]:
    reqs = [Requirement(text) for text in plugin.requires]
    return {
        canonicalize_name(r.name)
        for r in reqs
        if r.marker is None or r.marker.evaluate(dict(markers))
    }


def _diagnose(plugin: PluginWheel) -> Unloadable:
    wanted = " or ".join(PLUGIN_GROUPS)
    typos = {g: difflib.get_close_matches(g, PLUGIN_GROUPS, n=1, cutoff=0.8) for g in plugin.groups}
    near = {g: m[0] for g, m in sorted(typos.items()) if m}
    if near:
        found = "; ".join(
            f"its group [{g}] looks like a misspelling of {m}" for g, m in near.items()
        )
        fix = ", ".join(f"rename [{g}] to [{m}]" for g, m in near.items())
    else:
        groups = sorted(plugin.groups)
        found = f"its groups: {', '.join(groups)}" if groups else "it declares none"
        fix = f"declare the plugin's entry point under [{PLUGIN_GROUPS[0]}] or [{PLUGIN_GROUPS[1]}]"
    return Unloadable(
        plugin, f"registers no entry point in {wanted}, so vLLM would never load it; {found}", fix
    )


def unloadable(plugins: Sequence[PluginWheel], markers: Mapping[str, str]) -> list[Unloadable]:
    """The wheels of ``plugins`` with no entry point in a vLLM plugin group that no other of them
    requires (requirement markers evaluated with ``markers``), in order."""
    required = [_required(p, markers) for p in plugins]
    found = []
    for i, plugin in enumerate(plugins):
        if plugin.groups & set(PLUGIN_GROUPS):
            continue
        name = canonicalize_name(plugin.distribution)
        if any(name in names for j, names in enumerate(required) if j != i):
            continue
        found.append(_diagnose(plugin))
    return found
