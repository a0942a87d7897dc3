"""The pack reads the Triton/vLLM pairs from the repository's images/compat.toml."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy.compat_pairs import CompatFileError, load_pairs, pairs_from_document
from runtime.compat import load_matrix


def test_pairs_match_the_runtime_matrix() -> None:
    matrix = load_matrix(Path(__file__).resolve().parents[2] / "images" / "compat.toml")
    pairs = load_pairs()
    assert ("26.08", "0.27.1") in pairs
    assert (matrix.default.triton, matrix.default.vllm) in pairs
    assert ("26.08", "0.33.0") not in pairs


def test_release_keyed_tables_are_read_too() -> None:
    assert pairs_from_document({"triton": {"26.07": {"vllm": "0.24.0"}}}) == {("26.07", "0.24.0")}


def test_missing_or_empty_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CompatFileError, match="not found"):
        load_pairs(tmp_path / "compat.toml")
    (tmp_path / "compat.toml").write_text("format_version = 1\n", encoding="utf-8")
    with pytest.raises(CompatFileError, match="no Triton/vLLM pair"):
        load_pairs(tmp_path / "compat.toml")
