"""Emptying a folder in place (an emptyDir mount stays; what is in it goes)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

__all__ = ["remove_entries"]


def remove_entries(entries: Iterable[Path]) -> int:
    """Delete each entry (a folder with its contents; a link itself, never what it points at);
    returns how many were deleted."""
    removed = 0
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed += 1
    return removed
