"""Stage 3's guard against plugin wheels that would shadow the image's own packages.

A plugin lands in ``LLM_SERVING_PLUGIN_DIR``, which comes first on Triton's ``PYTHONPATH``, or
in site-packages itself: either way a wheel that ships a ``vllm/`` package (or ``torch.py``, a
``.pth`` file, another distribution's metadata) replaces what the image pinned, whatever its
distribution is called. So the wheel's files are compared with the installed distributions'.
"""

from __future__ import annotations

import csv
import importlib.metadata as md
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from runtime.entrypoint.errors import StageFailed

__all__ = ["ImageNames", "check_no_shadowing"]

#: An import name, as the place it takes in ``sys.path``: ``("vllm",)`` for a package or
#: module, ``("google", "protobuf")`` for a portion of a namespace package.
ImportKey = tuple[str, ...]

_METADATA_DIRS = (".dist-info", ".egg-info", ".data")
_MODULE_SUFFIXES = (".py", ".pyc", ".pyd", ".so")
# Data a wheel puts under the interpreter's prefix lands in site-packages through this path.
_SITE_PACKAGES_DATA = re.compile(r"lib(?:64)?/python[^/]*/(?:site|dist)-packages/(.+)")


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
    """Which installed distributions own each import key (what a plugin must not ship)."""

    owners: dict[ImportKey, set[str]] = field(default_factory=dict)
    """Import key -> the canonical names of the distributions that install it."""
    portions: dict[str, set[str]] = field(default_factory=dict)
    """Namespace package name -> the distributions that install a portion of it."""
    regular: set[str] = field(default_factory=set)
    """Top-level folders that some distribution makes a regular package (has ``__init__``)."""

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
        owners: dict[ImportKey, set[str]] = {}
        portions: dict[str, set[str]] = {}
        for name, paths in found:
            for key in _keys(paths, regular):
                owners.setdefault(key, set()).add(name)
                if len(key) == 2:
                    portions.setdefault(key[0], set()).add(name)
        return cls(owners=owners, portions=portions, regular=regular)

    def claimed(self, key: ImportKey) -> set[str]:
        """The distributions a file with import key ``key`` would shadow."""
        hits = set(self.owners.get(key, ()))
        # A package or module also shadows every portion of a namespace of that name; a
        # namespace portion is shadowed by (and shadows) a regular package of its top name.
        hits |= (
            self.portions.get(key[0], set()) if len(key) == 1 else self.owners.get(key[:1], set())
        )
        return hits


def _site_packages_paths(names: list[str], label: str) -> list[list[str]]:
    """The wheel's files that install into site-packages, as path parts."""
    (own,) = {n.split("/", 1)[0] for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)}
    own_data = own.removesuffix(".dist-info") + ".data"
    paths: list[list[str]] = []
    for name in names:
        if name.endswith("/"):
            continue
        top, _, rest = name.partition("/")
        if top == own:
            continue
        if top == own_data:
            scheme, _, inner = rest.partition("/")
            match = _SITE_PACKAGES_DATA.fullmatch(inner) if scheme == "data" else None
            if scheme in ("purelib", "platlib"):
                name = inner
            elif match is not None:
                name = match.group(1)
            else:
                continue  # scripts, headers, other data: outside site-packages
            top = name.split("/", 1)[0]
        if top.endswith(_METADATA_DIRS):
            raise StageFailed(
                f"plugin wheel {label} ships {top}, the metadata of another distribution",
                "rebuild the wheel from the plugin's own project only, then the package",
            )
        paths.append(name.split("/"))
    return paths


def check_no_shadowing(wheel: Path, label: str, image: ImageNames, pinned: set[str]) -> None:
    """Refuse a wheel whose files would replace a package, module or metadata of the image."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        raise StageFailed(
            f"plugin wheel {label} cannot be read: {exc}", "rebuild the package"
        ) from exc
    paths = _site_packages_paths(names, label)
    for parts in paths:
        if len(parts) == 1 and parts[0].endswith(".pth"):
            raise StageFailed(
                f"plugin wheel {label} ships {parts[0]}, a .pth file: it would run at every "
                "interpreter start and can put anything ahead of vLLM on sys.path",
                "drop the .pth file from the plugin wheel and rebuild the package",
            )
    for key, path in _keys(paths, image.regular | _regular(paths)).items():
        shadowed = image.claimed(key)
        if shadowed:
            owners = ", ".join(f"{n} (pinned)" if n in pinned else n for n in sorted(shadowed))
            raise StageFailed(
                f"plugin wheel {label} ships {path}: it would shadow {'.'.join(key)}, which "
                f"the image has from {owners}",
                f"drop {'/'.join(key)} from the plugin wheel (a plugin ships only its own "
                "packages) and rebuild the package",
            )
