"""The version matrix loads, rejects malformed files, and checks an installed vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import compat
from runtime.compat import (
    CompatError,
    CompatPair,
    check_vllm_version,
    constraints_text,
    load_matrix,
    probe_imports,
)

# Triton's published table (release → vLLM, structured-output key), copied here so the test
# does not depend on the design documents at run time.
PUBLISHED = {
    "25.09": ("0.10.1.1", "guided_decoding"),
    "25.10": ("0.10.2", "guided_decoding"),
    "25.11": ("0.11.0", "structured_outputs"),
    "25.12": ("0.11.1", "structured_outputs"),
    "26.01": ("0.13.0", "structured_outputs"),
    "26.02": ("0.15.1", "structured_outputs"),
    "26.03": ("0.17.1", "structured_outputs"),
    "26.04": ("0.19.0", "structured_outputs"),
    "26.05": ("0.19.0", "structured_outputs"),
    "26.06": ("0.22.1", "structured_outputs"),
    "26.07": ("0.24.0", "structured_outputs"),
    "26.08": ("0.27.1", "structured_outputs"),
}

GOOD = """
format_version = 1
default_triton = "26.08"

[[pairs]]
triton = "26.08"
vllm = "0.27.1"
structured_outputs_key = "structured_outputs"
python = "3.12"
backend_modules = ["json"]
pins = { torch = "2.9.0" }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "compat.toml"
    path.write_text(text)
    return path


def test_repository_matrix_matches_published_table() -> None:
    matrix = load_matrix()
    assert {p.triton: (p.vllm, p.structured_outputs_key) for p in matrix.pairs} == PUBLISHED
    assert all(p.python == "3.12" and p.backend_modules for p in matrix.pairs)


def test_default_pair_is_triton_26_08_with_vllm_0_27_1() -> None:
    default = load_matrix().default
    assert (default.triton, default.vllm) == ("26.08", "0.27.1")
    assert default.structured_outputs_key == "structured_outputs"
    assert default.image == "nvcr.io/nvidia/tritonserver:26.08-vllm-python-py3"
    assert "vllm.v1.sample.logits_processor" in default.backend_modules


def test_only_the_oldest_release_uses_the_removed_metrics_module() -> None:
    matrix = load_matrix()
    assert "vllm.engine.metrics" in matrix.for_triton("25.09").backend_modules
    newer = [p for p in matrix.pairs if p.triton != "25.09"]
    assert all("vllm.v1.metrics.loggers" in p.backend_modules for p in newer)


def test_unknown_release_lists_supported_ones() -> None:
    with pytest.raises(CompatError) as err:
        load_matrix().for_triton("24.01")
    assert "'24.01'" in str(err.value)
    assert "25.09" in str(err.value) and "26.08" in str(err.value)


def test_pair_is_frozen() -> None:
    pair = load_matrix().default
    with pytest.raises(AttributeError):
        pair.vllm = "0.33.0"  # type: ignore[misc]


def test_loads_a_given_file_with_pins(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path, GOOD))
    assert matrix.default == CompatPair(
        triton="26.08",
        vllm="0.27.1",
        structured_outputs_key="structured_outputs",
        python="3.12",
        backend_modules=("json",),
        pins=(("torch", "2.9.0"),),
    )


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("format_version = 1", "format_version = 2", "format_version"),
        ('"structured_outputs"\n', '"guided_json"\n', "pairs.0.structured_outputs_key"),
        ('vllm = "0.27.1"', 'vllm = "latest"', "pairs.0.vllm"),
        ('python = "3.12"', 'python = "3.12"\ncuda = "13"', "pairs.0.cuda"),
        ('default_triton = "26.08"', 'default_triton = "26.09"', "default_triton '26.09'"),
        ('{ torch = "2.9.0" }', '{ vllm = "0.27.1" }', "pairs.0.pins"),
        ('backend_modules = ["json"]', "backend_modules = []", "pairs.0.backend_modules"),
    ],
)
def test_malformed_matrix_names_the_field(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(CompatError) as err:
        load_matrix(path)
    assert expected in str(err.value)
    assert str(path) in str(err.value)


def test_duplicate_release_is_refused(tmp_path: Path) -> None:
    text = GOOD + GOOD[GOOD.index("[[pairs]]") :]
    with pytest.raises(CompatError, match=r"26\.08 is listed twice"):
        load_matrix(write(tmp_path, text))


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(CompatError, match="cannot read"):
        load_matrix(tmp_path / "missing.toml")
    with pytest.raises(CompatError, match="not valid TOML"):
        load_matrix(write(tmp_path, "format_version = "))


def test_vllm_version_check() -> None:
    pair = load_matrix().for_triton("26.07")
    check_vllm_version(pair, "0.24.0")
    with pytest.raises(CompatError) as err:
        check_vllm_version(pair, "0.27.1")
    assert "vllm 0.27.1" in str(err.value) and "vllm==0.24.0" in str(err.value)
    with pytest.raises(CompatError, match="not installed"):
        check_vllm_version(pair, None)


def test_installed_vllm_is_the_default_pairs() -> None:
    # The dev environment installs the default pair's vLLM (Makefile VLLM_VERSION).
    assert compat.installed_vllm_version() == load_matrix().default.vllm


def test_probe_imports_reports_each_failure() -> None:
    failures = probe_imports(("json", "runtime.no_such_module", "os.path"))
    assert list(failures) == ["runtime.no_such_module"]
    assert "ModuleNotFoundError" in failures["runtime.no_such_module"]


def test_constraints_pin_vllm_and_the_extra_pins(tmp_path: Path) -> None:
    text = constraints_text(load_matrix(write(tmp_path, GOOD)).default)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == ["vllm==0.27.1", "torch==2.9.0"]


def test_main_prints_constraints_and_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compat.main(["constraints"]) == 0
    assert "vllm==0.27.1" in capsys.readouterr().out
    assert compat.main(["check", "--triton", "26.07"]) == 1
    assert "vllm==0.24.0" in capsys.readouterr().err
    assert compat.main(["check", "--matrix", str(write(tmp_path, GOOD))]) == 0
    assert "matches Triton 26.08" in capsys.readouterr().out


def test_environment_override_of_the_matrix_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(compat.MATRIX_ENV_VAR, str(write(tmp_path, GOOD)))
    assert load_matrix().default.backend_modules == ("json",)
    assert len(load_matrix(compat.default_matrix_path()).pairs) == len(PUBLISHED)
