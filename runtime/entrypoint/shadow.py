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
    if not found:
        return
    first = found[0]
    if first.kind == "metadata":
        raise StageFailed(
            f"plugin wheel {label} ships {first.path.split('/', 1)[0]}, the metadata of another "
            "distribution",
            "rebuild the wheel from the plugin's own project only, then the package",
        )
    if first.kind == "pth":
        raise StageFailed(
            f"plugin wheel {label} ships {first.path}, a .pth file: it would run at every "
            "interpreter start and can put anything ahead of vLLM on sys.path",
            "drop the .pth file from the plugin wheel and rebuild the package",
        )
    owners = ", ".join(f"{n} (pinned)" if n in pinned else n for n in sorted(first.owners))
    raise StageFailed(
        f"plugin wheel {label} ships {first.path}: it would shadow {'.'.join(first.key)}, which "
        f"the image has from {owners}",
        f"drop {'/'.join(first.key)} from the plugin wheel (a plugin ships only its own "
        "packages) and rebuild the package",
    )
