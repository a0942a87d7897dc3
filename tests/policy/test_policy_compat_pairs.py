"""The pack reads the Triton/vLLM pairs through the one matrix reader, ``contracts.compat``."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.compat import CompatError, load_matrix


def test_supported_pairs_come_from_the_repository_matrix() -> None:
    matrix = load_matrix(Path(__file__).resolve().parents[2] / "images" / "compat.toml")
    assert ("26.08", "0.27.1") in matrix.supported
    assert (matrix.default.triton, matrix.default.vllm) in matrix.supported
    assert ("26.08", "0.33.0") not in matrix.supported


def test_missing_or_empty_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CompatError, match="cannot read"):
        load_matrix(tmp_path / "compat.toml")
    (tmp_path / "compat.toml").write_text("format_version = 1\n", encoding="utf-8")
    with pytest.raises(CompatError, match="default_triton"):
        load_matrix(tmp_path / "compat.toml")


def test_policy_names_stay_free_of_copies() -> None:
    # The pack spells no label, annotation or matrix file of its own: contracts owns them.
    root = Path(__file__).resolve().parents[2] / "policy"
    for path in root.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert '"llm-serving/' not in text, path
        assert "tomllib" not in text, path
