"""The Triton release ↔ vLLM version matrix (``images/compat.toml``): its types and its reader.

Standard library only, so the stacks, the serving image and the policy pack's own virtualenv
all read the matrix through this one reader. What checks an installed vLLM against a pair stays
with the serving image (``runtime.compat``).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MATRIX_ENV_VAR",
    "STRUCTURED_OUTPUTS_KEYS",
    "CompatError",
    "CompatMatrix",
    "CompatPair",
    "default_matrix_path",
    "load_matrix",
    "matrix_from_document",
    "read_toml",
]

MATRIX_ENV_VAR = "LLM_SERVING_COMPAT_MATRIX"
STRUCTURED_OUTPUTS_KEYS = ("guided_decoding", "structured_outputs")
_FILE_NAME = "compat.toml"
_IMAGE_REPOSITORY = "nvcr.io/nvidia/tritonserver"
_TRITON = re.compile(r"^\d{2}\.\d{2}$")
_VLLM = re.compile(r"^\d+(\.\d+)+$")
_PYTHON = re.compile(r"^3\.\d+$")
_RESPONSE_HOOK = re.compile(r"^[\w.]+:[\w]+\.[\w]+$")
_PAIR_FIELDS = frozenset(
    {"triton", "vllm", "structured_outputs_key", "python", "backend_modules", "pins",
     "response_hook"}
)  # fmt: skip
_MATRIX_FIELDS = frozenset({"format_version", "default_triton", "pairs"})


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
    """What the backend imports: ``module``, or ``module:name`` for a name it takes from one."""
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

    @property
    def supported(self) -> frozenset[tuple[str, str]]:
        """Every supported ``(triton, vllm)`` pair."""
        return frozenset((pair.triton, pair.vllm) for pair in self.pairs)

    def for_triton(self, release: str) -> CompatPair:
        """The pair of a Triton release (``26.08``); raises `CompatError` listing the supported."""
        for pair in self.pairs:
            if pair.triton == release:
                return pair
        raise CompatError(
            f"Triton release {release!r} is not in the compatibility matrix; "
            f"supported releases: {', '.join(self.releases)}"
        )


class _FieldError(ValueError):
    """One field of the document is wrong: where (``pairs.0.vllm``) and why."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.where = where


def default_matrix_path() -> Path:
    """The installed matrix (the package build puts it beside ``runtime/``), else the checkout's
    ``images/compat.toml``."""
    root = Path(__file__).resolve().parent.parent
    installed = root / "runtime" / _FILE_NAME
    return installed if installed.is_file() else root / "images" / _FILE_NAME


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """``path`` parsed; raises `CompatError` naming ``what`` it is for when it cannot be."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CompatError(f"cannot read {what} {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CompatError(f"{path} is not valid TOML: {exc}") from exc


def _string(value: Any, where: str, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(value, str):
        raise _FieldError(where, "Input should be a valid string")
    if pattern is not None and not pattern.match(value):
        raise _FieldError(where, f"String should match pattern '{pattern.pattern}'")
    return value


def _extra(document: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    for key in document:
        if key not in allowed:
            raise _FieldError(f"{where}{key}", "Extra inputs are not permitted")


def _required(document: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in document:
        raise _FieldError(f"{where}{key}", "Field required")
    return document[key]


def _backend_modules(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise _FieldError(where, "List should have at least 1 item")
    for name in value:
        module, _, attribute = _string(name, where).partition(":")
        if not module or (":" in name and not attribute.isidentifier()):
            raise _FieldError(where, f"{name!r} is not `module` or `module:name`")
    return tuple(value)


def _pins(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise _FieldError(where, "Input should be a valid dictionary")
    for name, version in value.items():
        _string(version, f"{where}.{name}")
        if name.lower().replace("_", "-").replace(".", "-") == "vllm":
            raise _FieldError(where, "vllm is pinned by the pair's `vllm` field, not in `pins`")
    return tuple(sorted(value.items()))


def _pair(raw: Any, where: str) -> CompatPair:
    if not isinstance(raw, dict):
        raise _FieldError(where.rstrip("."), "Input should be a valid dictionary")
    _extra(raw, _PAIR_FIELDS, where)
    key = _string(_required(raw, "structured_outputs_key", where), f"{where}structured_outputs_key")
    if key not in STRUCTURED_OUTPUTS_KEYS:
        raise _FieldError(
            f"{where}structured_outputs_key",
            f"Input should be {' or '.join(repr(k) for k in STRUCTURED_OUTPUTS_KEYS)}",
        )
    hook = raw.get("response_hook")
    return CompatPair(
        triton=_string(_required(raw, "triton", where), f"{where}triton", _TRITON),
        vllm=_string(_required(raw, "vllm", where), f"{where}vllm", _VLLM),
        structured_outputs_key=key,
        python=_string(_required(raw, "python", where), f"{where}python", _PYTHON),
        backend_modules=_backend_modules(
            _required(raw, "backend_modules", where), f"{where}backend_modules"
        ),
        pins=_pins(raw.get("pins", {}), f"{where}pins"),
        response_hook=None if hook is None else _string(
            hook, f"{where}response_hook", _RESPONSE_HOOK
        ),
    )  # fmt: skip


def _matrix(document: Mapping[str, Any]) -> CompatMatrix:
    _extra(document, _MATRIX_FIELDS, "")
    if _required(document, "format_version", "") != 1:
        raise _FieldError("format_version", "Input should be 1")
    default = _string(_required(document, "default_triton", ""), "default_triton")
    pairs = _required(document, "pairs", "")
    if not isinstance(pairs, list) or not pairs:
        raise _FieldError("pairs", "List should have at least 1 item")
    return CompatMatrix(
        pairs=tuple(_pair(raw, f"pairs.{index}.") for index, raw in enumerate(pairs)),
        default_triton=default,
    )


def matrix_from_document(document: Mapping[str, Any], source: str) -> CompatMatrix:
    """Validate a parsed matrix; raises `CompatError` naming ``source`` and the bad field."""
    try:
        matrix = _matrix(document)
    except _FieldError as exc:
        raise CompatError(f"{source}: field {exc.where}: {exc}") from exc
    seen: set[str] = set()
    for pair in matrix.pairs:
        if pair.triton in seen:
            raise CompatError(f"{source}: Triton release {pair.triton} is listed twice")
        seen.add(pair.triton)
    if matrix.default_triton not in seen:
        raise CompatError(
            f"{source}: default_triton {matrix.default_triton!r} is not one of the listed pairs "
            f"({', '.join(sorted(seen))})"
        )
    return matrix


def load_matrix(
    path: Path | None = None, environ: Callable[[str], str | None] = os.environ.get
) -> CompatMatrix:
    """Read and validate the matrix (``path``, else ``$LLM_SERVING_COMPAT_MATRIX``, else the
    shipped file); raises `CompatError` naming the file and the bad field."""
    if path is None:
        override = environ(MATRIX_ENV_VAR)
        path = Path(override) if override else default_matrix_path()
    return matrix_from_document(read_toml(path, "the compatibility matrix"), str(path))
