"""Collect a package's files from its source tree, refusing anything that escapes the root."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from runtime.package.errors import PackageError
from runtime.package.manifest import check_relative_path

__all__ = ["SourceFile", "collect", "resolve_inside"]


@dataclass(frozen=True)
class SourceFile:
    """A regular file to package: its path in the package and where its bytes are."""

    arcname: str
    source: Path
    origin: str
    """Which spec field brought it in (for duplicate messages)."""


def resolve_inside(root: Path, relative: str, field: str) -> Path:
    """``root / relative`` after checking the path is relative and does not leave ``root``."""
    try:
        check_relative_path(relative)
    except ValueError as exc:
        raise PackageError(f"{field}: {exc}") from exc
    candidate = root / relative
    _refuse_escape(root, candidate, relative)
    return candidate


def _refuse_escape(root: Path, candidate: Path, relative: str) -> None:
    if candidate.is_symlink() or any(p.is_symlink() for p in _parents_below(root, candidate)):
        target = candidate.resolve()
        if not target.is_relative_to(root.resolve()):
            raise PackageError(
                f"{relative} is a symlink out of the package root (-> {target}); "
                "copy the file into the package instead"
            )


def _parents_below(root: Path, path: Path) -> list[Path]:
    parents = []
    for parent in path.parents:
        if parent == root:
            break
        parents.append(parent)
    return parents


def collect(root: Path, relative: str, field: str) -> list[SourceFile]:
    """Every regular file at or under ``relative`` (a file or a folder) in the source tree."""
    start = resolve_inside(root, relative, field)
    if not start.exists():
        raise PackageError(f"{field}: {relative} does not exist under {root}")
    if start.is_file():
        return [SourceFile(relative, start, field)]
    if start.is_symlink():
        raise PackageError(f"{field}: {relative} is a symlinked folder; copy it into the package")
    found: list[SourceFile] = []
    for dirpath, dirnames, filenames in os.walk(start):
        here = Path(dirpath)
        for name in sorted(dirnames):
            if (here / name).is_symlink():
                rel = _rel(root, here / name)
                raise PackageError(
                    f"{field}: {rel} is a symlinked folder; copy it into the package"
                )
        for name in sorted(filenames):
            path = here / name
            rel = _rel(root, path)
            _refuse_escape(root, path, rel)
            mode = path.stat().st_mode
            if not stat.S_ISREG(mode):
                raise PackageError(f"{field}: {rel} is not a regular file")
            found.append(SourceFile(rel, path, field))
    return found


def _rel(root: Path, path: Path) -> str:
    return PurePosixPath(path.relative_to(root)).as_posix()
