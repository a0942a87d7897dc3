"""Stage 3's guard against plugin wheels that would shadow the image's own packages.

The wheel's files are compared with the installed distributions' (`ImageNames.scan`), so this
is the complete check; ``llm-serving package build`` runs the same analysis against the
distributions the image is known to have.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from runtime.entrypoint.errors import StageFailed
from runtime.package.shadowing import ImageNames, WheelLayoutError, find_shadowing

__all__ = ["check_no_shadowing"]


def check_no_shadowing(wheel: Path, label: str, image: ImageNames, pinned: set[str]) -> None:
    """Refuse a wheel whose files would replace a package, module or metadata of the image."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
        found = find_shadowing(names, image)
    except (OSError, zipfile.BadZipFile, WheelLayoutError) as exc:
        raise StageFailed(
            f"plugin wheel {label} cannot be read: {exc}", "rebuild the package"
        ) from exc
    if found:
        problem, fix = found[0].explain(label, pinned)
        raise StageFailed(problem, f"{fix}, then the package")
