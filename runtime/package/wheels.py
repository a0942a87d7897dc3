"""Plugin wheels: read their metadata and refuse those the image's pip would not install or
that would move a pinned distribution."""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from email.parser import HeaderParser
from itertools import chain
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from runtime.package.errors import PackageError
from runtime.package.requirements import through_extras
from runtime.package.specifiers import can_both_hold

__all__ = [
    "PLUGIN_GROUPS",
    "ImageEnvironment",
    "WheelInfo",
    "check_against_pins",
    "check_installable",
    "parse_pins",
    "read_wheel",
    "required_names",
    "vllm_ranges",
]

PLUGIN_GROUPS = ("vllm.general_plugins", "vllm.logits_processors")

# manylinux's first names for glibc 2.17, 2.12 and 2.5 (PEP 599, 571, 513), which pip accepts
# beside the PEP 600 form.
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


@dataclass(frozen=True)
class ImageEnvironment:
    """The serving image's interpreter and platform, which plugin requirement markers are
    evaluated against (not the machine that builds the package)."""

    python: str
    """The image's Python, ``major.minor`` as ``images/compat.toml`` records it."""
    machine: str = "x86_64"
    """The image's CPU architecture, as ``platform.machine()`` names it."""
    glibc: tuple[int, int] = (2, 39)
    """The image's glibc, which bounds the manylinux wheels it installs. The matrix does not
    record it: every Triton release it lists (25.09 on) is built on Ubuntu 24.04, glibc 2.39."""

    def markers(self) -> dict[str, str]:
        """PEP 508 marker variables of the image: CPython ``python`` on x86_64 Linux."""
        return {
            "python_version": self.python,
            # The matrix records major.minor only, so a patch-level marker is judged against
            # the minor release's first patch.
            "python_full_version": f"{self.python}.0",
            "implementation_version": f"{self.python}.0",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "os_name": "posix",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": self.machine,
            "extra": "",
        }

    def describe(self) -> str:
        """The image as a wheel's tags address it: ``CPython 3.12, Linux x86_64, glibc 2.39``."""
        return f"CPython {self.python}, Linux {self.machine}, glibc {self.glibc[0]}.{self.glibc[1]}"

    def tags(self) -> frozenset[Tag]:
        """The wheel tags the image's pip installs: what `packaging.tags.sys_tags` gives in the
        image, built from the matrix rather than from the interpreter that runs this."""
        major, minor = (int(part) for part in self.python.split(".")[:2])
        platforms = []
        for glibc_minor in range(self.glibc[1], 4, -1):
            platforms.append(f"manylinux_{self.glibc[0]}_{glibc_minor}_{self.machine}")
            if glibc_minor in _LEGACY_MANYLINUX:
                platforms.append(f"{_LEGACY_MANYLINUX[glibc_minor]}_{self.machine}")
        platforms.append(f"linux_{self.machine}")  # what a local build on Linux is tagged
        interpreter = f"cp{major}{minor}"
        return frozenset(
            chain(
                cpython_tags((major, minor), [interpreter], platforms),
                compatible_tags((major, minor), interpreter, platforms),
            )
        )


@dataclass(frozen=True)
class WheelInfo:
    """What a wheel declares: name, version, requirements and vLLM entry points."""

    distribution: str
    version: str
    requires: tuple[str, ...]
    entry_points: dict[str, list[str]]
    """Entry point names by vLLM plugin group."""
    groups: frozenset[str] = frozenset()
    """Every entry-point group the wheel declares, vLLM's or not (to name a misspelt one)."""
    files: tuple[str, ...] = ()
    """The wheel's member names, in archive order."""
    tags: frozenset[Tag] | None = None
    """The tags of the wheel's file name; ``None`` only where the info was not read from a
    wheel file."""


def read_wheel(path: Path, label: str) -> WheelInfo:
    """Read ``*.dist-info/METADATA`` and ``entry_points.txt`` of a wheel (``label`` names it),
    refusing one whose file name is not a wheel's or names another distribution or version than
    its METADATA (pip refuses to install either)."""
    name_of_file, version_of_file, tags = _parse_name(path.name, label)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            metadata_name = _one(names, "METADATA", label)
            metadata = _text(archive, metadata_name, label)
            ep_name = metadata_name.rsplit("/", 1)[0] + "/entry_points.txt"
            entry_text = _text(archive, ep_name, label) if ep_name in names else ""
    # zipfile reports damage as BadZipFile, zlib.error, EOFError or, for an encrypted or
    # unsupported member, RuntimeError and NotImplementedError.
    except (
        OSError,
        EOFError,
        RuntimeError,
        NotImplementedError,
        zipfile.BadZipFile,
        zlib.error,
    ) as exc:
        raise PackageError(
            f"plugin wheel {label} cannot be read as a wheel ({exc}); rebuild it "
            "(pip wheel or python -m build) or drop it from plugins"
        ) from exc
    headers = HeaderParser().parsestr(metadata)
    name, version = headers.get("Name"), headers.get("Version")
    if not name or not version:
        raise PackageError(f"plugin wheel {label}: METADATA lacks Name or Version")
    try:
        same_version = Version(version) == version_of_file
    except InvalidVersion:
        same_version = False
    if canonicalize_name(name) != name_of_file or not same_version:
        raise PackageError(
            f"plugin wheel {label}: its file name says {name_of_file} {version_of_file}, its "
            f"METADATA {name} {version}, and pip refuses a wheel whose name and metadata "
            "disagree; rename the file back to the name its builder gave it, or rebuild the wheel"
        )
    return WheelInfo(
        distribution=name,
        version=version,
        requires=tuple(headers.get_all("Requires-Dist") or ()),
        entry_points=_entry_points(entry_text),
        groups=_groups(entry_text),
        files=tuple(names),
        tags=tags,
    )


def _parse_name(file_name: str, label: str) -> tuple[str, Version, frozenset[Tag]]:
    """The canonical name, version and tags a wheel's file name gives (PEP 427)."""
    try:
        name, version, _, tags = parse_wheel_filename(file_name)
    except InvalidWheelFilename as exc:
        raise PackageError(
            f"plugin wheel {label}: {file_name} is not a wheel's file name ({exc}), and pip "
            "installs a wheel only by its name-version-python-abi-platform.whl file name; "
            "rename it back to the name its builder gave it"
        ) from exc
    return name, version, tags


def check_installable(info: WheelInfo, label: str, environment: ImageEnvironment) -> None:
    """Refuse a wheel none of whose file-name tags the image's pip installs (a wheel built for
    macOS, another CPU or another Python); an info not read from a file is not judged."""
    if info.tags is None or info.tags & environment.tags():
        return
    major, minor = environment.python.split(".")[:2]
    tags = ", ".join(sorted(str(tag) for tag in info.tags))
    raise PackageError(
        f"plugin wheel {label} is built for {tags}, and the image ({environment.describe()}) "
        f"installs none of these; rebuild it as a pure-Python wheel (py3-none-any) or for "
        f"cp{major}{minor} manylinux {environment.machine} (for instance with pip wheel inside "
        "the serving image)"
    )


def _text(archive: zipfile.ZipFile, name: str, label: str) -> str:
    """A member of the wheel as text; wheel metadata is UTF-8 (PEP 427)."""
    try:
        return archive.read(name).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PackageError(
            f"plugin wheel {label}: {name} is not UTF-8 ({exc.reason} at byte {exc.start}); "
            "rebuild the wheel with UTF-8 metadata"
        ) from exc


def _one(names: list[str], leaf: str, label: str) -> str:
    found = [n for n in names if n.count("/") == 1 and n.endswith(f".dist-info/{leaf}")]
    if len(found) != 1:
        raise PackageError(f"plugin wheel {label} has {len(found)} *.dist-info/{leaf}, not 1")
    return found[0]


def _entry_points(text: str) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    group: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1].strip()
        elif group in PLUGIN_GROUPS and "=" in line:
            groups.setdefault(group, []).append(line.split("=", 1)[0].strip())
    return {g: sorted(names) for g, names in sorted(groups.items())}


def _groups(text: str) -> frozenset[str]:
    lines = (line.strip() for line in text.splitlines())
    return frozenset(line[1:-1].strip() for line in lines if line[:1] == "[" and line[-1:] == "]")


def parse_pins(lines: list[str]) -> dict[str, Version]:
    """Exact ``name==version`` pins from constraints-file lines (comments and blanks skipped)."""
    pins: dict[str, Version] = {}
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            req = Requirement(line)
            (spec,) = req.specifier
        except (InvalidRequirement, ValueError) as exc:
            raise PackageError(f"constraint {line!r} is not an exact name==version pin") from exc
        if spec.operator != "==" or "*" in spec.version:
            raise PackageError(f"constraint {line!r} is not an exact name==version pin")
        pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def required_names(requires: Iterable[str], environment: ImageEnvironment) -> frozenset[str]:
    """The canonical names of ``requires`` whose markers hold in the image, bounded or not."""
    markers = environment.markers()
    reqs = [Requirement(text) for text in requires]
    return frozenset(
        canonicalize_name(r.name) for r in reqs if r.marker is None or r.marker.evaluate(markers)
    )


def vllm_ranges(requires: Iterable[str], environment: ImageEnvironment) -> dict[str, SpecifierSet]:
    """vLLM's requirements that hold in the image, by canonical name (unbounded ones left out)."""
    markers = environment.markers()
    ranges: dict[str, SpecifierSet] = {}
    for text in requires:
        req = Requirement(text)
        if (req.marker is None or req.marker.evaluate(markers)) and req.specifier:
            name = canonicalize_name(req.name)
            ranges[name] = ranges.get(name, SpecifierSet()) & req.specifier
    return ranges


def check_against_pins(
    info: WheelInfo,
    label: str,
    pins: dict[str, Version],
    environment: ImageEnvironment,
    ranges: Mapping[str, SpecifierSet] | None = None,
    shipped: Mapping[str, tuple[str, ...]] | None = None,
) -> None:
    """Refuse a wheel the image's pip would not install (`check_installable`), that is, or
    requires another version of, a distribution the image pins, or a version that none of
    ``ranges`` (what the image's vLLM requires) allows; requirements whose markers do not hold
    in the image's ``environment`` are skipped. ``shipped`` gives the requirements of the
    package's wheels by canonical name, so that what an extra of one of them adds
    (``lib[fast]``) is checked too."""
    check_installable(info, label, environment)
    ranges = ranges or {}
    own = canonicalize_name(info.distribution)
    if own in pins:
        raise PackageError(
            f"plugin wheel {label} is {info.distribution} {info.version}, a distribution the "
            f"image pins ({own}=={pins[own]}); drop it from the package"
        )
    found = through_extras(
        f"plugin wheel {label}", info.requires, (shipped or {}).get, environment.markers()
    )
    try:
        required = list(found)
    except ValueError as exc:
        raise PackageError(f"{exc}; rebuild the wheel with valid Requires-Dist lines") from exc
    for item in required:
        req, text = item.requirement, str(item.requirement)
        name = canonicalize_name(req.name)
        if name in ranges and not can_both_hold(req.specifier, ranges[name]):
            raise PackageError(
                f"{item.who} requires {text!r}, but the image's vLLM requires "
                f"{name}{ranges[name]}, so pip cannot install both; rebuild the plugin with a "
                f"requirement that allows {name}{ranges[name]}"
            )
        if name not in pins:
            continue
        try:
            allowed = pins[name] in req.specifier or not req.specifier
        except InvalidVersion:
            allowed = False
        if not allowed:
            raise PackageError(
                f"{item.who} requires {text!r} but the image pins {name}=={pins[name]}; "
                f"rebuild the plugin against {name}=={pins[name]}"
            )
