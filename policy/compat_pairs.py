"""Read the supported Triton/vLLM pairs from ``images/compat.toml`` without the runtime package.

The pack runs in its own virtualenv (pulumi-policy pins protobuf 5), so it cannot import
``runtime.compat``; it reads the same facts file with ``tomllib``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CompatFileError", "default_compat_path", "load_pairs", "pairs_from_document"]

_RELEASE = re.compile(r"^\d{2}\.\d{2}$")


class CompatFileError(ValueError):
    """``compat.toml`` is missing or lists no Triton/vLLM pair."""


def default_compat_path() -> Path:
    """``images/compat.toml`` of the checkout this pack lives in."""
    return Path(__file__).resolve().parent.parent / "images" / "compat.toml"


def pairs_from_document(document: Mapping[str, Any]) -> set[tuple[str, str]]:
    """Every ``(triton, vllm)`` pair in a parsed matrix: tables holding both keys, or tables
    keyed by a Triton release (``26.08``) holding ``vllm``."""
    pairs: set[tuple[str, str]] = set()

    def walk(node: Any, key: str | None) -> None:
        if isinstance(node, Mapping):
            triton, vllm = node.get("triton"), node.get("vllm")
            if isinstance(triton, str) and isinstance(vllm, str):
                pairs.add((triton, vllm))
            elif key is not None and _RELEASE.match(key) and isinstance(vllm, str):
                pairs.add((key, vllm))
            for child_key, child in node.items():
                walk(child, str(child_key))
        elif isinstance(node, list):
            for child in node:
                walk(child, key)

    walk(document, None)
    return pairs


def load_pairs(path: Path | None = None) -> set[tuple[str, str]]:
    """The pairs listed in ``path`` (default: ``images/compat.toml``)."""
    path = path or default_compat_path()
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise CompatFileError(
            f"{path} not found; the policy pack needs images/compat.toml"
        ) from error
    pairs = pairs_from_document(document)
    if not pairs:
        raise CompatFileError(f"{path} lists no Triton/vLLM pair (tables with triton and vllm)")
    return pairs
