"""Whether two PEP 440 version specifiers leave a version both allow: a plugin's requirement
against the range the image's vLLM requires of the same distribution."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = ["can_both_hold"]


@dataclass(frozen=True)
class _Bound:
    version: Version
    inclusive: bool


@dataclass(frozen=True)
class _Interval:
    """The versions one specifier allows, as one interval (``None``: unbounded)."""

    low: _Bound | None
    high: _Bound | None


def _prefix_interval(prefix: str) -> _Interval:
    """``==1.2.*``: from 1.2's first dev release up to, not including, 1.3's."""
    release = Version(prefix).release
    upper = ".".join(str(n) for n in (*release[:-1], release[-1] + 1))
    return _Interval(
        _Bound(Version(f"{prefix}.dev0"), True), _Bound(Version(f"{upper}.dev0"), False)
    )


def _interval(spec: Specifier) -> _Interval | None:
    """The interval ``spec`` allows; ``None`` for ``!=`` and ``===``, which bound nothing."""
    op, text = spec.operator, spec.version
    if op in ("!=", "==="):
        return None
    if op == "==" and text.endswith(".*"):
        return _prefix_interval(text[:-2])
    version = Version(text)
    if op == "~=":
        # ~=1.4.5 is >=1.4.5 together with ==1.4.*.
        prefix = ".".join(str(n) for n in version.release[:-1])
        return _Interval(_Bound(version, True), _prefix_interval(prefix).high)
    if op == "==":
        return _Interval(_Bound(version, True), _Bound(version, True))
    if op in (">=", ">"):
        return _Interval(_Bound(version, op == ">="), None)
    return _Interval(None, _Bound(version, op == "<="))


def _higher_low(a: _Bound | None, b: _Bound | None) -> _Bound | None:
    if a is None or b is None:
        return a or b
    if a.version != b.version:
        return a if a.version > b.version else b
    return _Bound(a.version, a.inclusive and b.inclusive)


def _lower_high(a: _Bound | None, b: _Bound | None) -> _Bound | None:
    if a is None or b is None:
        return a or b
    if a.version != b.version:
        return a if a.version < b.version else b
    return _Bound(a.version, a.inclusive and b.inclusive)


def can_both_hold(first: SpecifierSet, second: SpecifierSet) -> bool:
    """Whether some version satisfies both sets. Exact where the sets are ranges and pins; a
    ``!=`` excludes only what it names, and an unparsable version is given the benefit of the
    doubt (pip decides at install time)."""
    try:
        specs = [*first, *second]
        intervals = [i for i in map(_interval, specs) if i is not None]
    except (InvalidVersion, InvalidSpecifier, IndexError):
        return True
    low: _Bound | None = None
    high: _Bound | None = None
    for interval in intervals:
        low = _higher_low(low, interval.low)
        high = _lower_high(high, interval.high)
    if low is not None and high is not None:
        if low.version > high.version:
            return False
        if low.version == high.version:
            if not (low.inclusive and high.inclusive):
                return False
            both = SpecifierSet(",".join(str(s) for s in specs))
            return both.contains(low.version, prereleases=True)
    # A continuum survives any finite set of != exclusions, unless a != prefix covers it all.
    for spec in specs:
        if spec.operator == "!=" and spec.version.endswith(".*"):
            excluded = _prefix_interval(spec.version[:-2])
            assert excluded.low is not None and excluded.high is not None
            if (
                low is not None
                and high is not None
                and low.version >= excluded.low.version
                and (
                    high.version < excluded.high.version
                    or (high.version == excluded.high.version and not high.inclusive)
                )
            ):
                return False
    return True
