"""Which files of a wheel land in site-packages, and which of them would shadow the image's.

A plugin lands in ``LLM_SERVING_PLUGIN_DIR``, which comes first on Triton's ``PYTHONPATH``, or
in site-packages itself: either way a wheel that ships a ``vllm/`` package (or ``torch.py``, a
``.pth`` file, another distribution's metadata) replaces what the image has, whatever its
distribution is called. The entrypoint compares a wheel's files with the installed
distributions' (`ImageNames.scan`), packaging with the import names of the distributions the
image is known to have (`ImageNames.of`); both read the findings of `find_shadowing`.

Files are judged where pip writes them, not by their names in the archive: pip normalises a
member's name (``x/../torch/__init__.py`` lands as ``torch/__init__.py``), and installs a
``*.data/`` folder's schemes other than purelib and platlib outside site-packages, at the top
of a ``--target`` folder or anywhere under the interpreter's prefix (``bin/``, ``include/``).
"""

from __future__ import annotations

import csv
import importlib.metadata as md
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from packaging.utils import canonicalize_name

__all__ = ["ImageNames", "ImportKey", "Shadowing", "WheelLayoutError", "find_shadowing"]

#: An import name, as the place it takes in ``sys.path``: ``("vllm",)`` for a package or
#: module, ``("google", "protobuf")`` for a portion of a namespace package.
ImportKey = tuple[str, ...]

_METADATA_DIRS = (".dist-info", ".egg-info", ".data")
_MODULE_SUFFIXES = (".py", ".pyc", ".pyd", ".so")
# The schemes of a wheel's *.data/ folder that pip installs into site-packages (or the --target
# folder); it puts data, scripts and headers elsewhere and refuses any other scheme.
_SITE_PACKAGES_SCHEMES = ("purelib", "platlib")


class WheelLayoutError(ValueError):
    """The archive has not exactly one ``*.dist-info/METADATA`` at its top: it is no wheel."""


@dataclass(frozen=True)
class Shadowing:
    """One file of a wheel that would replace something the image has."""

    kind: Literal["name", "scheme", "pth", "metadata", "import"]
    """``name``: a member name that is not a plain relative path; ``scheme``: a file of a
    ``*.data/`` scheme pip installs outside site-packages; ``pth``: a ``.pth`` file;
    ``metadata``: another distribution's metadata folder; ``import``: a package or module of the
    image."""
    member: str
    """The file's name inside the wheel."""
    path: str
    """Where the file lands, relative to site-packages; for ``name``, where pip would write it
    (the normalised name); for ``scheme``, the scheme's folder (``sneaky-1.0.data/scripts``)."""
    key: ImportKey = ()
    """For ``import``: the import name the file would take over."""
    owners: frozenset[str] = frozenset()
    """For ``import``: the canonical names of the image's distributions it would shadow."""

    def explain(self, label: str, pinned: set[str]) -> tuple[str, str]:
        """What is wrong with wheel ``label`` and what to do, as (problem, fix); ``pinned``
        names the distributions to call pinned."""
        shipped = f"plugin wheel {label} ships {self.member}"
        if self.kind == "name":
            landing = "" if self.path == self.member else f" (pip would write it as {self.path})"
            return (
                f"plugin wheel {label} has a member named {self.member!r}{landing}, not a plain "
                "relative path: empty, '.' or '..' parts, a leading '/' or a backslash let it "
                "land elsewhere than its name says, over the image's own files",
                "rebuild the wheel with a standard builder (pip wheel, python -m build), "
                "which writes plain member names",
            )
        if self.kind == "scheme":
            return (
                f"{shipped}, in the wheel's {self.path}/ folder: pip installs only "
                f"{' and '.join(_SITE_PACKAGES_SCHEMES)} into site-packages, and data, scripts "
                "and headers at the top of the plugin folder or under the image's prefix (bin/, "
                "include/, anything below it), where they replace the image's own files",
                "remove the data files, scripts and headers from the plugin project (a vLLM "
                "plugin needs none: vLLM loads it through its entry points) and rebuild the wheel",
            )
        if self.kind == "pth":
            return (
                f"{shipped}, a .pth file: in the image it would run at every interpreter start "
                "and can put anything ahead of vLLM on sys.path",
                "remove it from the plugin project's files and rebuild the wheel",
            )
        if self.kind == "metadata":
            return (
                f"{shipped}, metadata of another distribution ({self.path.split('/', 1)[0]})",
                "rebuild the wheel from the plugin's own project only",
            )
        landing = "" if self.path == self.member else f" (installed as {self.path})"
        owners = ", ".join(f"{n} (pinned)" if n in pinned else n for n in sorted(self.owners))
        return (
            f"{shipped}{landing}: it would shadow {'.'.join(self.key)}, which the image has "
            f"from {owners}",
            f"drop {'/'.join(self.key)} from the plugin project (a plugin ships only its own "
            "packages, under a name of its own) and rebuild the wheel",
        )


def _module(name: str) -> str:
    """``torch.py``, ``_C.cpython-312-x86_64-linux-gnu.so`` -> the name ``import`` uses."""
    return name.split(".", 1)[0] if name.endswith(_MODULE_SUFFIXES) else name


def _is_init(name: str) -> bool:
    return name.split(".", 1)[0] == "__init__" and name.endswith(_MODULE_SUFFIXES)


def _keys(paths: list[list[str]], regular: set[str]) -> dict[ImportKey, str]:
    """The import key of each path (split into parts), with one path that claims it.

    A top-level folder is one package when it or the image has its ``__init__``; otherwise it
    is a namespace that several distributions share (``google``, ``nvidia``), so the key goes
    one level down.
    """
    keys: dict[ImportKey, str] = {}
    for parts in paths:
        if len(parts) == 1:
            key: ImportKey = (_module(parts[0]),)
        elif parts[0] in regular:
            key = (parts[0],)
        else:
            key = (parts[0], _module(parts[1]))
        keys.setdefault(key, "/".join(parts))
    return keys


def _regular(paths: Iterable[list[str]]) -> set[str]:
    return {parts[0] for parts in paths if len(parts) == 2 and _is_init(parts[1])}


@dataclass(frozen=True)
class ImageNames:
    """Which of the image's distributions own each import key (what a plugin must not ship)."""

    owners: dict[ImportKey, set[str]] = field(default_factory=dict)
    """Import key -> the canonical names of the distributions that install it."""
    portions: dict[str, set[str]] = field(default_factory=dict)
    """Namespace package name -> the distributions that install a portion of it."""
    regular: set[str] = field(default_factory=set)
    """Top-level folders that some distribution makes a regular package (has ``__init__``)."""

    @classmethod
    def _index(
        cls, found: Iterable[tuple[str, Iterable[ImportKey]]], regular: set[str]
    ) -> ImageNames:
        owners: dict[ImportKey, set[str]] = {}
        portions: dict[str, set[str]] = {}
        for name, keys in found:
            for key in keys:
                owners.setdefault(key, set()).add(name)
                if len(key) == 2:
                    portions.setdefault(key[0], set()).add(name)
        return cls(owners=owners, portions=portions, regular=regular)

    @classmethod
    def of(cls, known: Mapping[str, Iterable[ImportKey]]) -> ImageNames:
        """From canonical distribution name -> its import keys; a one-part key is taken for a
        regular package or module."""
        regular = {key[0] for keys in known.values() for key in keys if len(key) == 1}
        return cls._index(known.items(), regular)

    @classmethod
    def scan(cls, path: list[str], ours: Path) -> ImageNames:
        """Every distribution on ``path`` but those an earlier start installed from ``ours``.

        RECORD is read as CSV text, not through ``Distribution.files``, which builds an object per
        file: the image lists about 100,000 of them.
        """
        ours_uri = ours.resolve().as_uri()
        found: list[tuple[str, list[list[str]]]] = []
        for dist in md.distributions(path=path):
            if (dist.read_text("direct_url.json") or "").find(ours_uri) >= 0:
                continue  # a plugin of this package, installed into site-packages last time
            name = canonicalize_name(dist.metadata["Name"] or "")
            record = dist.read_text("RECORD")
            if record is not None:
                rows = (row[0] for row in csv.reader(record.splitlines()) if row)
                paths = [r.split("/") for r in rows if r and not r.startswith("..")]
            else:  # an egg-info install: its top_level.txt is all there is
                top = (dist.read_text("top_level.txt") or "").split()
                paths = [[t, "__init__.py"] for t in top]
            paths = [
                p for p in paths if not p[0].endswith(_METADATA_DIRS) and p[0] != "__pycache__"
            ]
            found.append((name, paths))
        regular = set().union(*(_regular(paths) for _, paths in found))
        return cls._index(((name, _keys(paths, regular)) for name, paths in found), regular)

    def claimed(self, key: ImportKey) -> set[str]:
        """The distributions a file with import key ``key`` would shadow."""
        hits = set(self.owners.get(key, ()))
        # A package or module also shadows every portion of a namespace of that name; a
        # namespace portion is shadowed by (and shadows) a regular package of its top name.
        hits |= (
            self.portions.get(key[0], set()) if len(key) == 1 else self.owners.get(key[:1], set())
        )
        return hits


def _plain(member: str) -> bool:
    """Whether pip writes ``member`` (a folder's with its trailing ``/``) where its name says."""
    name = member.removesuffix("/")
    # normpath alone lets '..' at the start, a leading '/' and backslashes through.
    return (
        posixpath.normpath(name) == name
        and not name.startswith("/")
        and "\\" not in name
        and all(part not in ("", ".", "..") for part in name.split("/"))
    )


def _site_packages_files(names: list[str]) -> tuple[dict[str, str], list[Shadowing]]:
    """The wheel's files that install into site-packages (landing path -> member name), and
    those of them, or of the ``*.data/`` folder, that must not be installed at all: files of
    schemes that land outside site-packages, then other distributions' metadata."""
    own = {n.split("/", 1)[0] for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)}
    if len(own) != 1:
        raise WheelLayoutError(f"{len(own)} *.dist-info/METADATA at the top, not 1")
    (own_info,) = own
    files: dict[str, str] = {}
    outside: list[Shadowing] = []
    foreign: dict[str, Shadowing] = {}
    for member in names:
        if member.endswith("/"):
            continue
        name = member
        top, _, rest = name.partition("/")
        if top == own_info:
            continue
        # pip takes any top folder named *.data for the data folder, not only the wheel's own.
        if top.endswith(".data"):
            scheme, slash, inner = rest.partition("/")
            if scheme not in _SITE_PACKAGES_SCHEMES or not slash:
                outside.append(Shadowing("scheme", member, f"{top}/{scheme}"))
                continue
            name = inner
            top = name.split("/", 1)[0]
        if top.endswith(_METADATA_DIRS):
            foreign.setdefault(top, Shadowing("metadata", member, name))
            continue
        files.setdefault(name, member)
    return files, outside + list(foreign.values())


def find_shadowing(names: list[str], image: ImageNames) -> list[Shadowing]:
    """What of the wheel whose members are ``names`` would replace what ``image`` has: member
    names that are not plain relative paths (nothing else is judged then), files pip installs
    outside site-packages, other distributions' metadata, then ``.pth`` files, then packages
    and modules, in wheel order.

    Raises `WheelLayoutError` when ``names`` are not a wheel's.
    """
    # Judged first and alone: every later rule reads a member's name as where it lands.
    unplain = [Shadowing("name", m, posixpath.normpath(m)) for m in names if not _plain(m)]
    if unplain:
        return unplain
    files, found = _site_packages_files(names)
    paths = [path.split("/") for path in files]
    found += [
        Shadowing("pth", files["/".join(parts)], parts[0])
        for parts in paths
        if len(parts) == 1 and parts[0].endswith(".pth")
    ]
    for key, path in _keys(paths, image.regular | _regular(paths)).items():
        shadowed = image.claimed(key)
        if shadowed:
            found.append(Shadowing("import", files[path], path, key, frozenset(shadowed)))
    return found
