"""The version matrix loads, rejects malformed files, and checks an installed vLLM."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from contracts.compat import (
    MATRIX_ENV_VAR,
    CompatError,
    CompatPair,
    default_matrix_path,
    load_matrix,
)
from runtime import compat
from runtime.compat import (
    check_pins,
    check_vllm_version,
    constraints_text,
    image_constraints_text,
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
    assert "vllm.v1.sample.logits_processor:LogitsProcessor" in default.backend_modules


def test_only_the_oldest_release_uses_the_removed_metrics_module() -> None:
    matrix = load_matrix()
    modules = {p.triton: {n.partition(":")[0] for n in p.backend_modules} for p in matrix.pairs}
    assert "vllm.engine.metrics" in modules.pop("25.09")
    assert all("vllm.v1.metrics.loggers" in names for names in modules.values())


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
        ('backend_modules = ["json"]', 'backend_modules = ["json:"]', "pairs.0.backend_modules"),
        ('backend_modules = ["json"]', 'backend_modules = [":x"]', "pairs.0.backend_modules"),
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


@pytest.mark.parametrize(
    ("installed", "accepted"),
    [("0.24.0+9114fd76", True), ("0.24.0+cu130", True), ("0.24.0.post1", False),
     ("0.24.0rc1", False), ("0.24", True), ("not a version", False)],
)  # fmt: skip
def test_vllm_version_check_ignores_only_a_local_label(installed: str, accepted: bool) -> None:
    # NGC builds report e.g. 0.11.1+9114fd76 (vllm-project/vllm#31424); pip's ==0.24.0 takes
    # those too, and nothing else.
    pair = load_matrix().for_triton("26.07")
    if accepted:
        check_vllm_version(pair, installed)
    else:
        with pytest.raises(CompatError, match="does not match"):
            check_vllm_version(pair, installed)


def test_pins_check_names_every_wrong_distribution() -> None:
    pair = load_matrix().default
    right = {"torch": "2.13.0+cu130", "torchaudio": "2.11.0", "torchvision": "0.28.0"}
    check_pins(pair, right.get)
    with pytest.raises(CompatError) as err:
        check_pins(pair, (right | {"torch": "2.12.0"} | {"torchvision": None}).get)
    message = str(err.value)
    assert "torch 2.12.0; no torchvision" in message and "torch==2.13.0" in message
    assert "torchaudio" not in message.partition("but found")[2]


def test_image_constraints_pin_the_pair_then_everything_else(tmp_path: Path) -> None:
    pair = load_matrix(write(tmp_path, GOOD)).default
    pair_file = constraints_text(pair)
    installed = {"vllm": "0.27.1+abc", "torch": "2.9.0", "numpy": "2.3.1", "llm-serving": "1.0"}
    text = image_constraints_text(pair, pair_file, installed)
    assert text.startswith(pair_file)
    pins = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert pins == ["vllm==0.27.1", "torch==2.9.0", "llm-serving==1.0", "numpy==2.3.1"]
    with pytest.raises(CompatError, match=r"torch 2\.8\.0"):
        image_constraints_text(pair, pair_file, installed | {"torch": "2.8.0"})
    with pytest.raises(CompatError, match=r"vllm 0\.26\.0"):
        image_constraints_text(pair, pair_file, installed | {"vllm": "0.26.0"})
    other = load_matrix().for_triton("26.07")
    with pytest.raises(CompatError, match=r"not the one of Triton 26\.07"):
        image_constraints_text(other, pair_file, installed)


NGC_TORCH = "2.9.0a0+3bcc3cd.nv26.08"  # the shape of NVIDIA's own torch builds


@pytest.mark.parametrize(
    "torch", [NGC_TORCH, "2.10.0a0+a36e1d39eb"], ids=["same-release", "next-minor"]
)
def test_the_base_may_hold_nvidias_own_build_of_a_pin(tmp_path: Path, torch: str) -> None:
    # Triton's vllm-python-py3 images are built FROM NGC's vLLM image (server build.py), whose
    # torch is NVIDIA's alpha build, often of the minor after vLLM's PyPI pin (NGC vLLM 26.03:
    # vLLM 0.17.1 with torch 2.11.0a0+a6c236b9fd1, where PyPI's vLLM 0.17.1 pins 2.10.0).
    pair = load_matrix(write(tmp_path, GOOD)).default
    installed = {"vllm": "0.27.1+b1082979.nv26.8.62699174", "torch": torch, "numpy": "1.26.4"}
    check_pins(pair, installed.get)
    text = image_constraints_text(pair, constraints_text(pair), installed)
    pins = [line for line in text.splitlines() if line and not line.startswith("#")]
    # The base's build is what later installs must keep: PyPI's 2.9.0 would replace it.
    assert pins == ["vllm==0.27.1", f"torch=={torch}", "numpy==1.26.4"]
    assert "in place of vLLM 0.27.1's torch==2.9.0" in text


@pytest.mark.parametrize(
    "torch", ["2.8.0a0+3bcc3cd.nv26.08", "2.9.0a0", "2.9.0.dev20260501+cu130", "3.0.0a0+x"]
)
def test_only_an_nvidia_build_of_the_pin_or_later_stands_in(tmp_path: Path, torch: str) -> None:
    # An earlier release, an unlabelled alpha, a PyTorch nightly, another major: a wrong base.
    pair = load_matrix(write(tmp_path, GOOD)).default
    with pytest.raises(CompatError, match=f"found torch {re.escape(torch)}"):
        image_constraints_text(pair, constraints_text(pair), {"vllm": "0.27.1", "torch": torch})


def test_a_pin_with_a_local_label_holds_only_that_build(tmp_path: Path) -> None:
    pair = load_matrix(write(tmp_path, GOOD.replace('"2.9.0"', f'"{NGC_TORCH}"'))).default
    pair_file = constraints_text(pair)
    assert f"torch=={NGC_TORCH}" in pair_file.splitlines()
    text = image_constraints_text(pair, pair_file, {"vllm": "0.27.1", "torch": NGC_TORCH})
    assert f"torch=={NGC_TORCH}" in text.splitlines()
    for other in ("2.9.0", "2.9.0a0", "2.9.0a0+ffffff.nv26.08"):
        with pytest.raises(CompatError, match=f"found torch {re.escape(other)}"):
            check_pins(pair, {"torch": other}.get)


def test_image_constraints_spell_a_legacy_version_so_pip_reads_the_file(tmp_path: Path) -> None:
    pair = load_matrix(write(tmp_path, GOOD)).default
    installed = {"vllm": "0.27.1", "torch": "2.9.0", "oldtool": "2019.1-custom"}
    text = image_constraints_text(pair, constraints_text(pair), installed)
    assert "oldtool===2019.1-custom" in text.splitlines()
    # pip reads each line of a constraints file as a PEP 508 requirement before installing.
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert [Requirement(line).name for line in lines] == ["vllm", "torch", "oldtool"]
    assert "2019.1-custom" in Requirement("oldtool===2019.1-custom").specifier


def test_probe_imports_checks_names_taken_from_a_module() -> None:
    failures = probe_imports(("json:loads", "json:no_such_name", "os.path:join"))
    assert list(failures) == ["json:no_such_name"]
    assert "cannot import name 'no_such_name' from 'json'" in failures["json:no_such_name"]


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
    # This environment's torch is 2.13.0+cpu: a matrix pinning 2.13.0 matches it.
    matching = write(tmp_path, GOOD.replace('torch = "2.9.0"', 'torch = "2.13.0"'))
    assert compat.main(["check", "--matrix", str(matching)]) == 0
    assert "vllm 0.27.1 and its pins match Triton 26.08" in capsys.readouterr().out
    assert compat.main(["check", "--matrix", str(write(tmp_path, GOOD))]) == 1
    assert "torch 2.13.0+cpu" in capsys.readouterr().err
    assert compat.main(["probe", "json", "json:nope"]) == 1
    assert capsys.readouterr().out.startswith("json:nope\tImportError")


def test_environment_override_of_the_matrix_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MATRIX_ENV_VAR, str(write(tmp_path, GOOD)))
    assert load_matrix().default.backend_modules == ("json",)
    assert len(load_matrix(default_matrix_path()).pairs) == len(PUBLISHED)
