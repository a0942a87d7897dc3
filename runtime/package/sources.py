"""Collect a package's files from its source tree, refusing anything that escapes the root."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from runtime.package.archive import shown_path
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
    _refuse_escape(root, candidate, relative, field)
    return candidate


def _refuse_escape(root: Path, candidate: Path, relative: str, field: str) -> None:
    if candidate.is_symlink() or any(p.is_symlink() for p in _parents_below(root, candidate)):
        try:
            target = candidate.resolve()
        except (RuntimeError, OSError) as exc:  # Python 3.11 raises RuntimeError, 3.13 OSError
            raise PackageError(
                f"{field}: {relative} is a symlink loop ({exc}); remove it or point it at a "
                "file inside the package"
            ) from exc
        if not target.is_relative_to(root.resolve()):
            raise PackageError(
                f"{field}: {relative} is a symlink out of the package root "
                f"(-> {shown_path(str(target))}); "
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
        _check_mode(relative, start.stat().st_mode, field)
        return [SourceFile(relative, start, field)]
    if start.is_symlink():
        raise PackageError(f"{field}: {relative} is a symlinked folder; copy it into the package")
    found: list[SourceFile] = []
    for dirpath, dirnames, filenames in os.walk(start, onerror=_unreadable(field)):
        here = Path(dirpath)
        for name in sorted(dirnames):
            if (here / name).is_symlink():
                rel = _rel(root, here / name)
                _check_name(rel, field)  # so that the message below is one printable line
                raise PackageError(
                    f"{field}: {rel} is a symlinked folder; copy it into the package"
                )
        for name in sorted(filenames):
            path = here / name
            rel = _rel(root, path)
            _check_name(rel, field)  # first: the messages below show it as it is
            _refuse_escape(root, path, rel, field)
            try:
                mode = path.stat().st_mode
            except FileNotFoundError as exc:
                raise PackageError(
                    f"{field}: {rel} is a dangling symlink (-> {shown_path(os.readlink(path))}); "
                    "remove it or point it at a file inside the package"
                ) from exc
            if not stat.S_ISREG(mode):
                raise PackageError(f"{field}: {rel} is not a regular file")
            _check_mode(rel, mode, field)
            found.append(SourceFile(rel, path, field))
    return found


def _check_mode(rel: str, mode: int, field: str) -> None:
    # The archive holds every file 0644, so the bit would be lost without a word; the pod's
    # unpack and package verify refuse such members too.
    if mode & (stat.S_ISUID | stat.S_ISGID):
        raise PackageError(
            f"{field}: {rel} has the setuid or setgid bit (mode {stat.S_IMODE(mode):#o}); "
            "packages hold plain files: clear it (chmod u-s,g-s) and build again"
        )


def _unreadable(field: str) -> Callable[[OSError], None]:
    """os.walk's error handler: a folder it cannot list (too deep, no permission) would
    otherwise be left out without a word."""

    def refuse(exc: OSError) -> None:
        raise PackageError(
            f"{field}: cannot list folder {exc.filename}: {exc.strerror or exc}; fix its "
            "permissions, or move its files higher in the tree"
        ) from exc

    return refuse


def _check_name(rel: str, field: str) -> None:
    # The manifest and the archive take POSIX paths only; refuse here, not half-way through
    # writing the version folder.
    try:
        check_relative_path(rel)
    except ValueError as exc:
        raise PackageError(f"{field}: file {rel!r} cannot be packaged: {exc}; rename it") from exc


def _rel(root: Path, path: Path) -> str:
    return PurePosixPath(path.relative_to(root)).as_posix()
