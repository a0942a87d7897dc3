"""The Triton release ↔ vLLM version matrix (``images/compat.toml``) and checks against it."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tomllib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "MATRIX_ENV_VAR",
    "CompatError",
    "CompatMatrix",
    "CompatPair",
    "check_vllm_version",
    "constraints_text",
    "default_matrix_path",
    "installed_vllm_version",
    "load_matrix",
    "main",
    "probe_imports",
]

MATRIX_ENV_VAR = "LLM_SERVING_COMPAT_MATRIX"
_FILE_NAME = "compat.toml"
_IMAGE_REPOSITORY = "nvcr.io/nvidia/tritonserver"


class CompatError(ValueError):
    """A Triton/vLLM pair, or the matrix file itself, is not usable; the message says why."""


@dataclass(frozen=True)
class CompatPair:
    """One supported Triton container release and the vLLM it ships."""

    triton: str
    vllm: str
    structured_outputs_key: str
    python: str
    backend_modules: tuple[str, ...]
    pins: tuple[tuple[str, str], ...] = ()
    """Further ``(distribution, exact version)`` pins of the image beside vllm."""
    response_hook: str | None = None
    """The stock vLLM backend's response-building method (``module:Class.method``), or
    ``None`` where it is not established for this release."""

    @property
    def image(self) -> str:
        """The NGC image of this release with the vLLM backend."""
        return f"{_IMAGE_REPOSITORY}:{self.triton}-vllm-python-py3"


@dataclass(frozen=True)
class CompatMatrix:
    """Every supported pair, in file order, and the release the serving image is built from."""

    pairs: tuple[CompatPair, ...]
    default_triton: str

    @property
    def default(self) -> CompatPair:
        """The pair the serving image is built from."""
        return self.for_triton(self.default_triton)

    @property
    def releases(self) -> tuple[str, ...]:
        """Supported Triton releases, in file order."""
        return tuple(pair.triton for pair in self.pairs)

    def for_triton(self, release: str) -> CompatPair:
        """The pair of a Triton release (``26.08``); raises `CompatError` listing the supported."""
        for pair in self.pairs:
            if pair.triton == release:
                return pair
        raise CompatError(
            f"Triton release {release!r} is not in the compatibility matrix; "
            f"supported releases: {', '.join(self.releases)}"
        )


class _PairModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    triton: str = Field(pattern=r"^\d{2}\.\d{2}$", description="Triton release, YY.MM")
    vllm: str = Field(pattern=r"^\d+(\.\d+)+$", description="exact vLLM version")
    structured_outputs_key: Literal["guided_decoding", "structured_outputs"]
    python: str = Field(pattern=r"^3\.\d+$")
    backend_modules: list[str] = Field(min_length=1)
    pins: dict[str, str] = Field(default_factory=dict)
    response_hook: str | None = Field(
        default=None,
        pattern=r"^[\w.]+:[\w]+\.[\w]+$",
        description="the stock backend's response hook, module:Class.method",
    )

    @field_validator("pins")
    @classmethod
    def _no_vllm_in_pins(cls, pins: dict[str, str]) -> dict[str, str]:
        if any(_normalise(name) == "vllm" for name in pins):
            raise ValueError("vllm is pinned by the pair's `vllm` field, not in `pins`")
        return pins


class _MatrixModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: Literal[1]
    default_triton: str
    pairs: list[_PairModel] = Field(min_length=1)


def default_matrix_path() -> Path:
    """Where the matrix lives: beside this module when installed, else in the source checkout."""
    here = Path(__file__).resolve().parent
    installed = here / _FILE_NAME
    if installed.is_file():
        return installed
    return here.parent / "images" / _FILE_NAME


def load_matrix(path: Path | None = None) -> CompatMatrix:
    """Read and validate the matrix (``path``, else ``$LLM_SERVING_COMPAT_MATRIX``, else the
    shipped file); raises `CompatError` naming the file and the bad field."""
    if path is None:
        override = os.environ.get(MATRIX_ENV_VAR)
        path = Path(override) if override else default_matrix_path()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CompatError(f"cannot read the compatibility matrix {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CompatError(f"{path} is not valid TOML: {exc}") from exc
    try:
        model = _MatrixModel.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise CompatError(f"{path}: field {where}: {first['msg']}") from exc
    seen: set[str] = set()
    for pair in model.pairs:
        if pair.triton in seen:
            raise CompatError(f"{path}: Triton release {pair.triton} is listed twice")
        seen.add(pair.triton)
    if model.default_triton not in seen:
        raise CompatError(
            f"{path}: default_triton {model.default_triton!r} is not one of the listed pairs "
            f"({', '.join(sorted(seen))})"
        )
    pairs = tuple(
        CompatPair(
            triton=pair.triton,
            vllm=pair.vllm,
            structured_outputs_key=pair.structured_outputs_key,
            python=pair.python,
            backend_modules=tuple(pair.backend_modules),
            pins=tuple(sorted(pair.pins.items())),
            response_hook=pair.response_hook,
        )
        for pair in model.pairs
    )
    return CompatMatrix(pairs=pairs, default_triton=model.default_triton)


def installed_vllm_version() -> str | None:
    """The installed vLLM distribution's version, or ``None`` when vLLM is not installed."""
    try:
        return dist_version("vllm")
    except PackageNotFoundError:
        return None


def check_vllm_version(pair: CompatPair, installed: str | None) -> None:
    """Raise `CompatError` unless the installed vLLM is exactly the pair's version."""
    if installed is None:
        raise CompatError(f"vLLM is not installed; Triton {pair.triton} needs vllm=={pair.vllm}")
    if installed != pair.vllm:
        raise CompatError(
            f"installed vllm {installed} does not match Triton {pair.triton}, which needs "
            f"vllm=={pair.vllm}; reinstall vllm=={pair.vllm} or use the image for the "
            f"release that ships vllm {installed}"
        )


def probe_imports(modules: tuple[str, ...]) -> dict[str, str]:
    """Import each module; return ``{module: error}`` for those that fail (empty when all load)."""
    failures: dict[str, str] = {}
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # any import-time failure makes the backend unusable
            failures[module] = f"{type(exc).__name__}: {exc}"
    return failures


def constraints_text(pair: CompatPair) -> str:
    """The pip constraints file the serving image enforces for ``pair`` (deterministic)."""
    lines = [
        "# Generated by `python -m runtime.compat constraints` from images/compat.toml",
        f"# (Triton {pair.triton}, vLLM {pair.vllm}); do not edit by hand.",
        f"vllm=={pair.vllm}",
        *(f"{name}=={version}" for name, version in pair.pins),
    ]
    return "\n".join(lines) + "\n"


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def main(argv: list[str] | None = None) -> int:
    """``python -m runtime.compat constraints|check [--triton R]``: used by the image build."""
    parser = argparse.ArgumentParser(prog="python -m runtime.compat", description=__doc__)
    parser.add_argument("command", choices=["constraints", "check"])
    parser.add_argument("--triton", help="Triton release (default: the matrix's default)")
    parser.add_argument("--matrix", type=Path, help="matrix file (default: the installed one)")
    parser.add_argument(
        "--versions-only", action="store_true", help="check versions, skip the import probe"
    )
    args = parser.parse_args(argv)
    try:
        matrix = load_matrix(args.matrix)
        pair = matrix.default if args.triton is None else matrix.for_triton(args.triton)
        if args.command == "constraints":
            sys.stdout.write(constraints_text(pair))
            return 0
        check_vllm_version(pair, installed_vllm_version())
        failures = {} if args.versions_only else probe_imports(pair.backend_modules)
        if failures:
            raise CompatError(
                "; ".join(f"cannot import {mod} ({err})" for mod, err in failures.items())
            )
    except CompatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    probed = "" if args.versions_only else "; backend modules import"
    print(f"vllm {pair.vllm} matches Triton {pair.triton}{probed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
